"""Demand at arrival shared by the gateways: each gateway's tally (serving/capacity_arrivals.py) in
PostgreSQL, summed over gateways by every reader of the capacity signal.

Public API:

    arrival_minutes(conn, start, end, deployment_id=None) -> {deployment: [Minute]}   # summed over gateways
    new_gateway_instance(gateway_id) -> str          # e.g. "gateway-0-3f9c2a71d04e": random per process
    ArrivalFlusher(arrivals, connect, instance=..., period_s=FLUSH_S)
        .flush_once() -> rows written (raises on failure)   .tick() (logs a failure once)
        .start() / .stop()                           # the worker thread; stop flushes one last time
    ArrivalFlusher.on_engine(arrivals, engine, instance=...)

Table `capacity_arrivals_minutely` (serving/tables.py, revision 0022): one row per deployment x UTC
minute x gateway process. A flush upserts the minutes whose counts changed since the last successful
flush, each with its **full** count (`SET requests = EXCLUDED.requests`, not an addition): writing a
minute twice, after a retry or after a flush whose commit the gateway never heard of, leaves the same
row, so nothing is counted twice; the current minute is written partial and overwritten later. A
failed flush marks nothing written, so the next tick writes those minutes again; requests never wait
for it (the hot path only counts in memory). A tick with nothing new opens no connection. The first
flush of each minute that writes also deletes every gateway's rows older than the tally keeps
(KEEP_MIN, 90 minutes: more than the signal's 60 minutes of history), those of gateways gone
included.

`gateway_instance` is random per process (the gateway's id plus 48 random bits): a restarted gateway
writes new rows beside its predecessor's instead of overwriting the counts that process wrote.

FLUSH_S (10 s) is no longer than the signal's settling delay (capacity_service.SETTLE_S, 10 s): a
minute counts for the readers 10 s after it ended, by when every live gateway has flushed it in full
(unless its flush failed or ran late).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import psycopg

from serving.capacity import Minute
from serving.capacity_arrivals import ArrivalDemand

log = logging.getLogger("serving.capacity")

FLUSH_S = 10.0  # seconds between two flushes of a gateway's tally

UPSERT_SQL = """
INSERT INTO capacity_arrivals_minutely AS a (deployment_id, minute, gateway_instance, requests, predicted_output_tokens)
SELECT deployment_id, minute, %(instance)s, requests, predicted_output_tokens
FROM unnest(%(deployments)s::text[], %(minutes)s::timestamptz[], %(requests)s::bigint[], %(outputs)s::bigint[])
     AS t(deployment_id, minute, requests, predicted_output_tokens)
ON CONFLICT (deployment_id, minute, gateway_instance)
DO UPDATE SET requests = EXCLUDED.requests, predicted_output_tokens = EXCLUDED.predicted_output_tokens
"""

PRUNE_SQL = "DELETE FROM capacity_arrivals_minutely WHERE minute < %(oldest)s"

ARRIVAL_MINUTES_SQL = """
SELECT deployment_id, minute, sum(requests)::bigint AS requests, sum(predicted_output_tokens)::bigint AS output_tokens
FROM capacity_arrivals_minutely
WHERE minute >= %(start)s AND minute < %(end)s
  AND (%(deployment)s::text IS NULL OR deployment_id = %(deployment)s::text)
GROUP BY deployment_id, minute ORDER BY deployment_id, minute
"""


def _minute_start(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


def arrival_minutes(conn: psycopg.Connection, start: datetime, end: datetime, *,
                    deployment_id: str | None = None) -> dict[str, list[Minute]]:
    """Per deployment, the minutes of [start, end) with arrivals, summed over every gateway that
    wrote them (requests, predicted output tokens; no prompt tokens, no TTFT), sorted."""
    rows = conn.execute(ARRIVAL_MINUTES_SQL, {"start": start, "end": end, "deployment": deployment_id}).fetchall()
    out: dict[str, list[Minute]] = {}
    for deployment, minute, requests, output in rows:
        out.setdefault(deployment, []).append(
            Minute(minute.astimezone(UTC), requests=int(requests), output_tokens=int(output)))
    return out


def new_gateway_instance(gateway_id: str) -> str:
    """The name of this gateway process in the table: its id and 48 random bits."""
    return f"{gateway_id}-{secrets.token_hex(6)}"


Connect = Callable[[], AbstractContextManager[psycopg.Connection]]


def engine_connections(engine) -> Connect:
    """Connections from a SQLAlchemy engine's pool, as psycopg connections that commit on a clean
    exit (the pool rolls back whatever a failure left open)."""

    @contextlib.contextmanager
    def connect():
        raw = engine.raw_connection()
        try:
            yield raw.driver_connection
            raw.driver_connection.commit()
        finally:
            raw.close()

    return connect


class ArrivalFlusher:
    """Writes one gateway's tally to the table: every `period_s` on a worker thread (`start`), and
    before each of the gateway's own reports (CapacityRefresher calls `tick`), so that the report of
    the gateway counts all it admitted. One flush at a time."""

    def __init__(self, arrivals: ArrivalDemand, connect: Connect, *, instance: str,
                 period_s: float = FLUSH_S) -> None:
        self.arrivals = arrivals
        self.connect = connect  # () -> context manager of a psycopg connection, committing on a clean exit
        self.instance = instance
        self.period_s = period_s
        self.failing = False  # the last flush failed (logged once until one succeeds)
        self._pruned_before: int | None = None  # the oldest kept minute of the last prune
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def on_engine(cls, arrivals: ArrivalDemand, engine, *, instance: str, period_s: float = FLUSH_S) -> ArrivalFlusher:
        return cls(arrivals, engine_connections(engine), instance=instance, period_s=period_s)

    def flush_once(self) -> int:
        """Writes the minutes counted since the last successful flush (full counts) and returns how
        many; the first write of each minute then deletes every gateway's rows older than the tally
        keeps. Nothing new: no connection, 0. Raises what the database raised; the minutes then stay
        unflushed."""
        with self._lock:
            rows = self.arrivals.unflushed()
            if not rows:
                return 0
            oldest = self.arrivals.oldest_kept()
            params = {"instance": self.instance, "deployments": [r[0] for r in rows],
                      "minutes": [_minute_start(r[1]) for r in rows], "requests": [r[2] for r in rows],
                      "outputs": [r[3] for r in rows]}
            with self.connect() as conn:
                conn.execute(UPSERT_SQL, params)
                conn.commit()
                self.arrivals.flushed(rows)
                if self._pruned_before != oldest:
                    conn.execute(PRUNE_SQL, {"oldest": _minute_start(oldest)})
                    conn.commit()
                    self._pruned_before = oldest
            return len(rows)

    def tick(self) -> None:
        """`flush_once`, its failure logged (once until a flush succeeds) and retried at the next tick."""
        try:
            self.flush_once()
        except Exception:
            if not self.failing:
                log.exception("capacity arrivals: flush to the database failed; retried every %g s (logged once "
                              "until it succeeds), the gateway keeps counting in memory", self.period_s)
            self.failing = True
        else:
            if self.failing:
                log.warning("capacity arrivals: flush to the database succeeded again")
            self.failing = False

    def _run(self) -> None:
        while not self._stopping.wait(self.period_s):
            self.tick()

    def start(self) -> None:
        if self._thread is None and self.period_s > 0:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="capacity-arrivals-flush", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops the worker thread, then flushes what is left (blocking: call it from a thread)."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
        self.tick()
