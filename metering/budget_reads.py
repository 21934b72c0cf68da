"""Budgets' reads (serving.budgets): a customer's metered tokens over a window and which events are
recorded, from one statement (`customer_token_sums`)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from infermeter.times import TimeInputError, Window

METERED_TOKENS_SQL = """
SELECT model, deployment_id, sum(input_tokens - cached_input_tokens)::bigint, sum(cached_input_tokens)::bigint,
       sum(output_tokens)::bigint, NULL::text, NULL::text
FROM request_rollup_hourly WHERE customer_id = %(customer)s AND hour >= %(start)s AND hour < %(end)s
GROUP BY model, deployment_id
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, k.source, k.event_id
FROM event_keys k JOIN unnest(%(sources)s::text[], %(ids)s::text[]) AS asked(source, event_id)
  ON k.source = asked.source COLLATE "C" AND k.event_id = asked.event_id COLLATE "C"
"""


def customer_token_sums(
    conn: psycopg.Connection,
    customer_id: str,
    window: Window,
    *,
    recorded_of: Sequence[tuple[str, str]] = (),
) -> tuple[dict[tuple[str, str], tuple[int, int, int]], set[tuple[str, str]]]:
    """A customer's request tokens over `window` (whole UTC hours: read from the hourly rollups, every
    request status) per (model, deployment): (uncached input, cached input, output); and which of the
    (source, event id) keys in `recorded_of` metering has recorded.

    Both answers come from ONE statement, so from one snapshot: metering commits an event's rollup
    and its key in one transaction, so an event asked about is either counted in the sums and
    returned as recorded, or neither."""
    if not window.on_hours:
        raise TimeInputError("customer_token_sums reads hourly rollups: the window must start and end on whole hours")
    keys = list(recorded_of)
    params = {"customer": customer_id, "start": window.start, "end": window.end,
              "sources": [k[0] for k in keys], "ids": [k[1] for k in keys]}
    sums: dict[tuple[str, str], tuple[int, int, int]] = {}
    recorded: set[tuple[str, str]] = set()
    for model, deployment, uncached, cached, output, source, event_id in conn.execute(METERED_TOKENS_SQL, params):
        if source is None:
            sums[(model, deployment)] = (int(uncached), int(cached), int(output))
        else:
            recorded.add((source, event_id))
    return sums, recorded
