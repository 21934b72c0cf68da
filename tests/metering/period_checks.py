"""The period totals against what a period reads today, for the period-totals tests.

"What a period reads today": the request and usage meters of `metering.queries.usage` /
`metering.period_reads.meter_totals` (whole hours from the hourly rollups, the edges from raw
events), tasks of `metering.period_reads.task_totals`, the other request counters straight from raw
events, and dedicated GPU-ms from gpu_ledger_hourly over the hours that start in the period (billing's edge-hour rule). Periods are
cut by billing's own function.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import psycopg

from billing.periods import Period, period_containing, periods_between
from infermeter.times import ceil_hour
from metering import period_reads, queries
from metering.calendars import SPAN, set_calendar
from metering.contract import REPLICA_V1, REQUEST_V1, TASK_V1, USAGE_V1, encode_event, make_event
from metering.kafka_types import Message
from metering.period_totals import REQUEST_COUNTS

UTC_MONTHS = ("UTC", 1)


def give_calendar(conn: psycopg.Connection, customer: str, timezone: str, anchor_day: int):
    """What billing does (billing_service.customers.calendar_to_metering): hand metering the schedule
    and its periods, computed by billing.periods."""
    change = set_calendar(conn, customer, timezone, anchor_day,
                          ((p.start, p.end) for p in periods_between(*SPAN, timezone, anchor_day)))
    conn.commit()
    return change


# --- events ------------------------------------------------------------------------------------


@dataclass
class Events:
    """Builds events (each a JSON line) with unique ids under a tag, and writes them as Kafka messages
    of one partition through a BatchWriter, offsets counting up."""

    tag: str
    lines: list[bytes] = field(default_factory=list)
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    offsets: itertools.count = field(default_factory=itertools.count)

    def _add(self, event: dict) -> bytes:
        line = encode_event(event)
        self.lines.append(line)
        return line

    def request(self, customer: str, at: datetime, *, model: str = "m1", deployment: str = "d1", status: str = "ok",
                input_tokens: int = 100, cached: int = 0, output: int = 10, task_id: str | None = None,
                attempt: int = 1, project: str | None = None) -> bytes:
        i = f"{self.tag}-r{next(self.ids)}"
        data = {"request_id": i, "customer_id": customer, "model": model, "deployment_id": deployment,
                "status": status, "input_tokens": input_tokens, "cached_input_tokens": cached, "output_tokens": output,
                "task_id": task_id, "attempt": attempt, "started_at": at, "finished_at": at}
        if project is not None:  # the API key's project; without it, the "no project" bucket
            data["project"] = project
        return self._add(make_event(REQUEST_V1, source="//test/gw", subject=customer, event_id=i, time=at, data=data))

    def task(self, customer: str, task_id: str, outcome: str, at: datetime, *, source: str = "//test/agents") -> bytes:
        return self._add(make_event(TASK_V1, source=source, subject=customer, event_id=f"{self.tag}-t{next(self.ids)}",
                                    time=at, data={"task_id": task_id, "customer_id": customer, "outcome": outcome,
                                                   "finished_at": at}))

    def usage(self, customer: str, meter: str, quantity: str, at: datetime) -> bytes:
        return self._add(make_event(USAGE_V1, source="//test/tools", subject=customer,
                                    event_id=f"{self.tag}-u{next(self.ids)}", time=at,
                                    data={"customer_id": customer, "meter": meter, "quantity": quantity}))

    def replica(self, customer: str | None, start: datetime, end: datetime, *, gpus: int = 1,
                deployment: str = "dedicated-1", gpu_type: str = "H100") -> bytes:
        return self._add(make_event(REPLICA_V1, source="//test/agent", subject=customer or "shared-pool",
                                    event_id=f"{self.tag}-g{next(self.ids)}", time=end, data={
                                        "replica_id": "rep-1", "deployment_id": deployment, "customer_id": customer,
                                        "gpu_type": gpu_type, "gpu_count": gpus, "interval_start": start,
                                        "interval_end": end, "busy_seconds": "0", "prompt_tokens": 0,
                                        "generation_tokens": 0}))

    def messages(self, lines: list[bytes]) -> list[Message]:
        return [Message("events", 0, next(self.offsets), None, line, {}, None) for line in lines]


# --- the comparison ------------------------------------------------------------------------------


def _nonzero(rows: dict) -> dict:
    return {k: v for k, v in rows.items() if any(v)}


def kept(conn: psycopg.Connection, customer: str, period_start: datetime, project: str | None = None) -> dict[str, dict]:
    """The period totals of one customer and period, all-zero rows left out: the requests summed over
    projects, or only `project`'s ('' = the requests without one)."""
    p = (customer, period_start)
    only = "" if project is None else "AND project = %s"
    requests = conn.execute(f"SELECT model, deployment_id, {', '.join(f'sum({c})' for c in REQUEST_COUNTS)} "
                            f"FROM request_period_totals WHERE customer_id = %s AND period_start = %s {only} "
                            "GROUP BY 1, 2", (*p, project) if project is not None else p).fetchall()
    usage = conn.execute("SELECT meter, quantity, events FROM usage_period_totals "
                         "WHERE customer_id = %s AND period_start = %s", p).fetchall()
    tasks = conn.execute("SELECT succeeded, failed, abandoned, succeeded_attempts, failed_attempts "
                         "FROM task_period_totals WHERE customer_id = %s AND period_start = %s", p).fetchall()
    gpu = conn.execute("SELECT deployment_id, gpu_type, gpu_ms FROM gpu_period_totals "
                       "WHERE customer_id = %s AND period_start = %s", p).fetchall()
    return {
        "requests": _nonzero({(m, d): tuple(int(x) for x in v) for m, d, *v in requests}),
        "usage": _nonzero({m: (Decimal(q), int(n)) for m, q, n in usage}),
        "tasks": _nonzero({"": tuple(int(x) for x in tasks[0])} if tasks else {}),
        "gpu": _nonzero({(d, g): (int(ms),) for d, g, ms in gpu}),
    }


def read_today(conn: psycopg.Connection, customer: str, period: Period, project: str | None = None) -> dict[str, dict]:
    """What the period reads today (see the module's docstring), in the shape of `kept` (with `project`,
    its requests only)."""
    window = period.window
    base = {(r["model"], r["deployment_id"]): (r["requests"], r["input_tokens"], r["cached_input_tokens"],
                                               r["output_tokens"])
            for r in queries.usage(conn, window, customer_id=customer, group_by=["model", "deployment"],
                                   project=project)}
    only = "" if project is None else "AND coalesce(payload->'data'->>'project', '') = %s "
    raw = conn.execute(
        "SELECT payload->'data'->>'model', payload->'data'->>'deployment_id', "
        "count(*) FILTER (WHERE payload->'data'->>'status' = 'ok'), "
        "count(*) FILTER (WHERE payload->'data'->>'status' = 'error'), "
        "count(*) FILTER (WHERE payload->'data'->>'status' = 'cancelled'), "
        "count(*) FILTER (WHERE payload->'data'->>'status' = 'rejected'), "
        "count(*) FILTER (WHERE (payload->'data'->>'attempt')::int > 1), "
        "coalesce(sum((payload->'data'->>'input_tokens')::bigint) FILTER (WHERE (payload->'data'->>'attempt')::int > 1), 0), "
        "coalesce(sum((payload->'data'->>'cached_input_tokens')::bigint) "
        "         FILTER (WHERE (payload->'data'->>'attempt')::int > 1), 0), "
        "coalesce(sum((payload->'data'->>'output_tokens')::bigint) FILTER (WHERE (payload->'data'->>'attempt')::int > 1), 0) "
        "FROM raw_events WHERE type = 'infermeter.request.v1' AND customer_id = %s "
        f"AND occurred_at >= %s AND occurred_at < %s {only}GROUP BY 1, 2",
        (customer, window.start, window.end, *([project] if project is not None else []))).fetchall()
    statuses = {(m, d): tuple(int(x) for x in v) for m, d, *v in raw}
    assert set(statuses) == set(base)
    requests = {k: (v[0], *statuses[k][:4], v[1], v[2], v[3], *statuses[k][4:]) for k, v in base.items()}

    quantities = {meter: quantity for _, meter, quantity, _ in
                  period_reads.meter_totals(conn, window.start, window.end, customer) if quantity}
    events = dict(conn.execute(
        "SELECT payload->'data'->>'meter', count(*) FROM raw_events WHERE type = 'infermeter.usage.v1' "
        "AND customer_id = %s AND occurred_at >= %s AND occurred_at < %s GROUP BY 1",
        (customer, window.start, window.end)).fetchall())
    usage = {m: (Decimal(quantities.get(m, 0)), int(n)) for m, n in events.items()}

    tasks_today = [{"customer_id": c, "succeeded": int(s), "failed": int(f), "attempts": int(sa + fa)}
                   for c, s, f, _, sa, fa in period_reads.task_totals(conn, window.start, window.end, customer)]
    abandoned = conn.execute("SELECT count(*) FROM task_outcomes WHERE customer_id = %s AND outcome = 'abandoned' "
                             "AND finished_at >= %s AND finished_at < %s",
                             (customer, window.start, window.end)).fetchone()[0]
    by_outcome = dict(conn.execute(
        "SELECT o.outcome, count(a.*) FROM task_outcomes o JOIN task_attempts a USING (customer_id, task_id) "
        "WHERE o.customer_id = %s AND o.finished_at >= %s AND o.finished_at < %s GROUP BY 1",
        (customer, window.start, window.end)).fetchall())
    tasks = {}
    if tasks_today or abandoned:
        t = tasks_today[0] if tasks_today else {"succeeded": 0, "failed": 0, "attempts": 0}
        succeeded_attempts, failed_attempts = by_outcome.get("succeeded", 0), by_outcome.get("failed", 0)
        assert succeeded_attempts + failed_attempts == t["attempts"]
        tasks[""] = (t["succeeded"], t["failed"], abandoned, succeeded_attempts, failed_attempts)

    gpu = conn.execute("SELECT deployment_id, gpu_type, sum(gpu_ms) FROM gpu_ledger_hourly WHERE customer_id = %s "
                       "AND hour >= %s AND hour < %s GROUP BY 1, 2",
                       (customer, ceil_hour(window.start), ceil_hour(window.end))).fetchall()
    return {
        "requests": _nonzero(requests),
        "usage": _nonzero(usage),
        "tasks": _nonzero(tasks),
        "gpu": _nonzero({(d, g): (int(ms),) for d, g, ms in gpu}),
    }


def check_customer(conn: psycopg.Connection, customer: str, schedule: tuple[str, int] = UTC_MONTHS) -> int:
    """Every period of the customer with usage or totals: totals == what the period reads today.
    Every period_start kept is one of the schedule's period starts. Returns the periods compared."""
    timezone, anchor_day = schedule
    instants = [t for (t,) in conn.execute(
        "SELECT occurred_at FROM raw_events WHERE customer_id = %(c)s UNION SELECT finished_at FROM task_outcomes "
        "WHERE customer_id = %(c)s UNION SELECT hour FROM gpu_ledger_hourly WHERE customer_id = %(c)s",
        {"c": customer}).fetchall()]
    starts = [t for (t,) in conn.execute(
        "SELECT period_start FROM request_period_totals WHERE customer_id = %(c)s UNION "
        "SELECT period_start FROM usage_period_totals WHERE customer_id = %(c)s UNION "
        "SELECT period_start FROM task_period_totals WHERE customer_id = %(c)s UNION "
        "SELECT period_start FROM gpu_period_totals WHERE customer_id = %(c)s", {"c": customer}).fetchall()]
    for start in starts:
        assert period_containing(start, timezone, anchor_day).start == start, f"{customer}: {start} starts no period"
    periods = {period_containing(t, timezone, anchor_day) for t in [*instants, *starts]}
    projects = [p for (p,) in conn.execute(
        "SELECT DISTINCT coalesce(payload->'data'->>'project', '') FROM raw_events WHERE customer_id = %(c)s "
        "AND type = 'infermeter.request.v1' UNION SELECT project FROM request_period_totals WHERE customer_id = %(c)s",
        {"c": customer}).fetchall()]
    for period in sorted(periods, key=lambda p: p.start):
        assert kept(conn, customer, period.start) == read_today(conn, customer, period), (customer, period.label)
        for project in projects:  # each project's totals too (the sum over them is checked just above)
            assert kept(conn, customer, period.start, project)["requests"] == \
                read_today(conn, customer, period, project)["requests"], (customer, period.label, project)
    return len(periods)


def totals_snapshot(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    """Every period totals row, and what each task counts, sorted."""
    keys = {"request_period_totals": 5, "usage_period_totals": 3, "task_period_totals": 2, "gpu_period_totals": 4}
    out = {table: conn.execute(f"SELECT * FROM {table} ORDER BY {', '.join(map(str, range(1, n + 1)))}").fetchall()
           for table, n in keys.items()}
    out["task_outcomes"] = conn.execute("SELECT customer_id, task_id, counted_period, counted_outcome, counted_attempts "
                                        "FROM task_outcomes ORDER BY 1, 2").fetchall()
    return out
