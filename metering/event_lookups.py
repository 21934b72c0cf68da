"""Which events metering has recorded, looked up by their identity.

- `recorded_event_keys`: which (source, event id) keys metering has recorded (in `event_keys`).
- `handled_event_keys`: which keys it has recorded or dead-lettered (the outbox's confirmer).
- `request_event_totals`: what it recorded for given request event ids (the replay checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg


def recorded_event_keys(conn: psycopg.Connection, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these (source, event id) keys metering has recorded (accepted and deduplicated)."""
    if not keys:
        return set()
    rows = conn.execute(
        "SELECT k.source, k.event_id FROM event_keys k"
        " JOIN unnest(%s::text[], %s::text[]) AS asked(source, event_id)"
        " ON k.source = asked.source COLLATE \"C\" AND k.event_id = asked.event_id COLLATE \"C\"",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(source, event_id) for source, event_id in rows}


HANDLED_EVENT_IDS_SQL = """
WITH asked AS (
    SELECT a.event_id, a.n FROM jsonb_array_elements_text(%(ids)s::jsonb) WITH ORDINALITY AS a(event_id, n)
), dead AS (
    SELECT d.event_id FROM dead_letters d
    WHERE d.received_at >= %(since)s AND d.event_source = %(source)s AND d.event_id IS NOT NULL
)
SELECT string_agg(
    CASE WHEN EXISTS (SELECT 1 FROM event_keys k
                      WHERE k.source = %(source)s COLLATE "C" AND k.event_id = a.event_id COLLATE "C")
              OR a.event_id IN (SELECT event_id FROM dead)
         THEN '1' ELSE '0' END, '' ORDER BY a.n)
FROM asked a
"""


def handled_event_keys(
    conn: psycopg.Connection, keys: Sequence[tuple[str, str]], *, since: float | datetime | None = None
) -> set[tuple[str, str]]:
    """Which of these (source, event id) keys metering has handled: recorded (in `event_keys`) or
    dead-lettered. The producers' outbox asks this, in batches of thousands, to know which events
    it may forget (metering/confirmer.py).

    `since` (unix seconds or a datetime): only dead letters received from then on are looked at
    (dead_letters is indexed by received_at, not by key); None looks at all of them. One statement
    per distinct source: the ids go as one JSON array and come back as one string of 0/1 flags,
    which keeps the cost per key to the two index probes."""
    from datetime import UTC

    import msgspec

    if not keys:
        return set()
    if isinstance(since, int | float):
        since = datetime.fromtimestamp(since, UTC)
    by_source: dict[str, list[str]] = {}
    for source, event_id in keys:
        by_source.setdefault(source, []).append(event_id)
    handled: set[tuple[str, str]] = set()
    for source, ids in by_source.items():
        flags = conn.execute(HANDLED_EVENT_IDS_SQL, {
            "ids": msgspec.json.encode(ids).decode(), "source": source,
            "since": since or datetime(1970, 1, 1, tzinfo=UTC),
        }).fetchone()[0] or ""
        handled.update((source, event_id) for event_id, flag in zip(ids, flags, strict=True) if flag == "1")
    return handled


def request_event_totals(conn: psycopg.Connection, request_ids: Sequence[str]) -> dict[str, int]:
    """What metering recorded for these request events (by event id): how many, and their tokens.

    Replay checks call it to compare metered tokens with the engine's own counters."""
    count, input_tokens, cached, output_tokens = conn.execute(
        "SELECT count(*), coalesce(sum((payload->'data'->>'input_tokens')::bigint), 0),"
        " coalesce(sum((payload->'data'->>'cached_input_tokens')::bigint), 0),"
        " coalesce(sum((payload->'data'->>'output_tokens')::bigint), 0)"
        " FROM raw_events WHERE type = 'infermeter.request.v1' AND event_id = ANY(%s)",
        (list(request_ids),),
    ).fetchone()
    return {"events": int(count), "input_tokens": int(input_tokens),
            "cached_input_tokens": int(cached), "output_tokens": int(output_tokens)}
