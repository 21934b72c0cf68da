"""The capacity signal's I/O: read metering (metering.ops_reads), build the reports (serving.capacity),
set the Prometheus gauges, and the gateway's background refresher.

Public API:

    policy_from_settings(settings) -> capacity.Policy
    as_of_for(now) -> datetime          # end of the last complete minute, SETTLE_S behind `now`
    capacity_reports(conn, *, now, policy, deployment_id=None, history=False) -> list[dict]
    publish_gauges(reports)             # the infermeter_deployment_* gauges of serving/metrics.py
    CapacityRefresher(engine, settings, flusher=None) # await .refresh_if_stale() (the gateway's /metrics);
                                        # .start() / await .aclose() (every period); .refresh_once()

Every reader (GET /v1/deployments/{id}/capacity, `infermeter capacity`, the gauges) computes the
same report from the same tables, statelessly: the last HISTORY_MIN minutes of demand are replayed
through Holt and the hysteresis each time, so any number of gateways, the API and the CLI agree, and
a restart changes nothing. Demand is metering's (requests when they finished) merged with demand at
arrival: what the gateways admitted, with each request's predicted output tokens, summed over the
gateways from the table they flush their tallies to (serving/capacity_arrivals.py,
serving/capacity_arrivals_store.py), so that under overload the signal sees what came, not only what
was served. A gateway flushes its own tally before computing its gauges (`flusher`), so its report
counts everything it admitted; another gateway's last seconds arrive with that gateway's next flush
(every 10 s, within the settling delay SETTLE_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta

import psycopg

from infermeter.settings import Settings
from metering import ops_reads, queries
from serving import capacity, metrics
from serving.capacity_arrivals import merge
from serving.capacity_arrivals_store import ArrivalFlusher, arrival_minutes

log = logging.getLogger("serving.capacity")

HISTORY_MIN = 60  # minutes of demand replayed through Holt and the hysteresis
CAPACITY_WINDOW_MIN = 60  # trailing replica intervals for tokens per busy second
LIVE_WINDOW_MIN = 2  # a replica with an interval ending in the last 2 minutes is running
SETTLE_S = 10  # the last minute counts once it ended this long ago (spool -> Kafka -> metering lag)


def policy_from_settings(settings: Settings) -> capacity.Policy:
    return capacity.Policy(target_utilisation=settings.target_utilisation, horizon_min=settings.capacity_horizon_min,
                           down_after_min=settings.capacity_scale_down_min)


def as_of_for(now: datetime) -> datetime:
    """The end of the last complete minute at least SETTLE_S before `now`."""
    settled = now.astimezone(UTC) - timedelta(seconds=SETTLE_S)
    return settled.replace(second=0, microsecond=0)


def capacity_reports(conn: psycopg.Connection, *, now: datetime, policy: capacity.Policy,
                     deployment_id: str | None = None, history: bool = False) -> list[dict]:
    """One report per deployment with metered requests, replica intervals or requests admitted by a
    gateway (demand at arrival, summed over gateways) in the history window (only `deployment_id` if
    given; [] when it has none), sorted by deployment."""
    as_of = as_of_for(now)
    start = as_of - timedelta(minutes=HISTORY_MIN)
    request_rows = ops_reads.request_minutes(conn, queries.Window(start, as_of), deployment_id=deployment_id)
    capacity_rows = ops_reads.replica_interval_sums(
        conn, queries.Window(as_of - timedelta(minutes=CAPACITY_WINDOW_MIN), as_of), deployment_id=deployment_id)
    recent_rows = ops_reads.replica_interval_sums(
        conn, queries.Window(as_of - timedelta(minutes=LIVE_WINDOW_MIN), as_of), deployment_id=deployment_id)
    arrived = arrival_minutes(conn, start, as_of, deployment_id=deployment_id)
    deployments = sorted({r["deployment_id"] for r in request_rows} | {r["deployment_id"] for r in capacity_rows}
                         | set(arrived))
    reports = []
    for dep in deployments:
        rows = [capacity.Minute(r["minute"], r["requests"], r["input_tokens"], r["output_tokens"], r["ttft_p90_s"])
                for r in request_rows if r["deployment_id"] == dep]
        if dep in arrived:
            rows = merge(rows, arrived[dep])
        minutes = capacity.fill_minutes(rows, start, as_of)
        reports.append(capacity.report(
            dep, as_of, minutes, [r for r in capacity_rows if r["deployment_id"] == dep],
            [r for r in recent_rows if r["deployment_id"] == dep], policy, history=history))
    return reports


_GAUGES = (metrics.DEMAND_TOKENS, metrics.DEMAND_FORECAST_TOKENS, metrics.CAPACITY_TOKENS,
           metrics.RECOMMENDED_REPLICAS)
_published: set[str] = set()


def publish_gauges(reports: list[dict]) -> None:
    """Set the four infermeter_deployment_* gauges per deployment; a deployment that left the window
    loses its series (an autoscaler then sees no data, not a stale value). A deployment without a
    measured capacity gets demand gauges only."""
    seen = set()
    for r in reports:
        dep = r["deployment_id"]
        seen.add(dep)
        metrics.DEMAND_TOKENS.labels(deployment=dep).set(r["demand"]["tokens_per_s"])
        metrics.DEMAND_FORECAST_TOKENS.labels(deployment=dep).set(r["forecast"].get("tokens_per_s", 0.0))
        for gauge, value in ((metrics.CAPACITY_TOKENS, r["capacity"]["tokens_per_busy_s"]),
                             (metrics.RECOMMENDED_REPLICAS, r["recommended_replicas"])):
            if value is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(dep)
            else:
                gauge.labels(deployment=dep).set(value)
    for dep in _published - seen:
        for gauge in _GAUGES:
            with contextlib.suppress(KeyError):
                gauge.remove(dep)
    _published.clear()
    _published.update(seen)


class CapacityRefresher:
    """Recomputes every deployment's report on a worker thread, reading the database through the
    gateway's SQLAlchemy engine, and publishes the gauges: when they are read (`refresh_if_stale`,
    called by the gateway's /metrics: at most once per `settings.capacity_refresh_s`, nothing while
    nobody scrapes), or every period from `start` on. Each round first flushes the gateway's own
    tally (`flusher`; a failed flush is logged by the flusher and the round goes on without this
    gateway's unflushed minutes). A failed round is logged and the gauges keep their last values."""

    def __init__(self, engine, settings: Settings, *, clock=None, flusher: ArrivalFlusher | None = None) -> None:
        self.engine = engine
        self.flusher = flusher  # the gateway's demand at arrival (serving/capacity_arrivals_store.py)
        self.period_s = settings.capacity_refresh_s
        self.policy = policy_from_settings(settings)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.task: asyncio.Task | None = None
        self.rounds = 0
        self._refreshed_at: float | None = None  # time.monotonic() of the last round, failed or not
        self._refreshing: asyncio.Lock | None = None

    def refresh_once(self) -> list[dict]:
        if self.flusher is not None:
            self.flusher.tick()
        raw = self.engine.raw_connection()  # the pool's psycopg connection
        try:
            reports = capacity_reports(raw.driver_connection, now=self.clock(), policy=self.policy)
            raw.driver_connection.rollback()  # read-only: end the snapshot, return the connection clean
        finally:
            raw.close()
        publish_gauges(reports)
        self.rounds += 1
        return reports

    async def refresh_if_stale(self) -> None:
        """One round if the last one is a period old or there was none (one at a time)."""
        if self.period_s <= 0 or self.engine is None or not self._stale():
            return
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            if self._stale():
                await self._round()

    def _stale(self) -> bool:
        return self._refreshed_at is None or time.monotonic() - self._refreshed_at >= self.period_s

    async def _round(self) -> None:
        try:
            await asyncio.to_thread(self.refresh_once)
        except Exception:
            log.exception("capacity refresh failed; gauges keep their last values")
        self._refreshed_at = time.monotonic()

    async def _run(self) -> None:
        while True:
            await self._round()
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        if self.period_s > 0 and self.engine is not None and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="capacity-refresher")

    async def aclose(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
