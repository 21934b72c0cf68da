"""Period totals kept at ingest: every meter the price books read, per customer x billing period.

A customer's billing periods reach metering as data (`metering.calendars.set_calendar`:
`customer_calendars`, `calendar_periods`); a customer without a calendar is kept by UTC calendar
month. The writer adds to the totals in the same transaction as the hourly rollups
(`metering.writer`), with the SQL of this module:

- `located(hours)`: each (customer, UTC hour) with the period that contains the hour's start (p1) and
  the one that starts inside the hour, if any (p2: a +05:30 or +05:45 zone starts its periods on the
  half or quarter hour), one index lookup each; `period_of(instant)` picks an instant's period among
  them. An instant outside the periods handed over (before 1970, after 2100) counts in its UTC month.
- requests (`request_period_totals`), usage meters (`usage_period_totals`) and dedicated GPU time
  (`gpu_period_totals`, an hour's slice in the period of the hour's start) are added up per period;
- tasks (`task_period_totals`) count at their outcome's finished_at: each task_outcomes row keeps
  what the task adds now (`counted_period`, `counted_outcome`, `counted_attempts`), and
  `TASK_PERIOD_CHANGES`, run after the batch's statement, moves the difference when a later outcome
  replaces it or attempts arrive after it.

`rebuild(conn, customer_id)` recomputes one customer's totals (after a calendar change, or on demand:
`infermeter metering rebuild-totals`) under the same rules: whole hours from the hourly rollups and the
hours a period boundary splits from that customer's raw events. Ingest holds the calendar lock shared,
a rebuild and a calendar change exclusive, so a batch never adds to periods of a calendar being
replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

# One advisory lock guards "the calendars and the totals agree": every ingest transaction holds it
# shared from before its write statement (READ COMMITTED: that statement's snapshot then sees the
# committed calendars), a calendar change or a rebuild exclusive.
_CALENDAR_LOCK_KEY = "hashtext('infermeter.customer_calendars')"
LOCK_CALENDARS_SHARED = f"SELECT pg_advisory_xact_lock_shared({_CALENDAR_LOCK_KEY})"
LOCK_CALENDARS = f"SELECT pg_advisory_xact_lock({_CALENDAR_LOCK_KEY})"
# A batch naming tasks also locks its customers' task buckets (64, in bucket order) before its statement:
# a task's share is read, then moved, so two writers must not move the same task at once. Producers key
# events by customer (one partition, one writer per customer), so the locks only ever wait when a
# customer's events come through two partitions; then they order the two transactions.
LOCK_TASK_CUSTOMERS = """
SELECT pg_advisory_xact_lock(hashtext('infermeter.task_period_totals'), bucket)
FROM (SELECT DISTINCT hashtext(customer_id) & 63 AS bucket FROM unnest(%s::text[]) AS customer_id ORDER BY 1) AS buckets
"""

REQUEST_COUNTS = (
    "requests", "requests_ok", "requests_error", "requests_cancelled", "requests_rejected",
    "input_tokens", "cached_input_tokens", "output_tokens",
    "retry_requests", "retry_input_tokens", "retry_cached_input_tokens", "retry_output_tokens",
)
# An infermeter.request.v1 row's fields, read from its payload (the writer's `req`, a rebuild's split hours).
# project: the API key's (request.v1 `project`), '' for an event without one (the "no project" bucket).
REQUEST_FIELDS = """payload->'data'->>'model' AS model, payload->'data'->>'deployment_id' AS deployment_id,
           coalesce(payload->'data'->>'project', '') AS project,
           payload->'data'->>'status' AS status, payload->'data'->>'task_id' AS task_id,
           payload->'data'->>'region' AS region,
           coalesce((payload->'data'->>'attempt')::int, 1) AS attempt,
           (payload->'data'->>'input_tokens')::bigint AS input_tokens,
           (payload->'data'->>'cached_input_tokens')::bigint AS cached_input_tokens,
           (payload->'data'->>'output_tokens')::bigint AS output_tokens"""
# REQUEST_COUNTS of a group of request rows (REQUEST_FIELDS), in that order.
_REQUEST_SUM_OF = (
    "count(*)",
    "count(*) FILTER (WHERE status = 'ok')",
    "count(*) FILTER (WHERE status = 'error')",
    "count(*) FILTER (WHERE status = 'cancelled')",
    "count(*) FILTER (WHERE status = 'rejected')",
    "sum(input_tokens)", "sum(cached_input_tokens)", "sum(output_tokens)",
    "count(*) FILTER (WHERE attempt > 1)",
    "coalesce(sum(input_tokens) FILTER (WHERE attempt > 1), 0)",
    "coalesce(sum(cached_input_tokens) FILTER (WHERE attempt > 1), 0)",
    "coalesce(sum(output_tokens) FILTER (WHERE attempt > 1), 0)",
)
REQUEST_SUMS = ",\n           ".join(_REQUEST_SUM_OF)
REQUEST_SUMS_NAMED = ",\n           ".join(f"{e} AS {c}" for e, c in zip(_REQUEST_SUM_OF, REQUEST_COUNTS, strict=True))
USAGE_FIELDS = """payload->'data'->>'meter' AS meter, payload->'data'->>'task_id' AS task_id,
           (payload->'data'->>'quantity')::numeric AS quantity"""


def add_counts(table: str, columns: tuple[str, ...]) -> str:
    """`ON CONFLICT ... DO UPDATE SET` clause adding EXCLUDED's counts to the row's."""
    return ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)


def located(hours: str, *, archived: bool = False) -> str:
    """A query over the relation `hours` (customer_id, hour: a UTC hour): each row with p1_start,
    p1_end, the customer's period that contains the hour's start, and p2_start, the start of the one
    that begins inside the hour (NULL when none). NULLs for a customer kept by UTC month (no calendar,
    or the ('UTC', 1) schedule, which has no rows) and outside the periods handed over. Two descents
    of calendar_periods' key per row. With `archived`, also whether the hour's month was archived
    (its raw events are gone: `archived_months`)."""
    month = ("(SELECT 1 FROM archived_months a WHERE a.month = date_trunc('month', h.hour, 'UTC')) IS NOT NULL"
             if archived else "false")
    return f"""SELECT h.customer_id, h.hour, p1.period_start AS p1_start, p1.period_end AS p1_end, p2.period_start AS p2_start,
           {month} AS archived
    FROM {hours} h
    LEFT JOIN customer_calendars c ON c.customer_id = h.customer_id
    LEFT JOIN LATERAL (
        SELECT p.period_start, p.period_end FROM calendar_periods p
        WHERE p.timezone = c.timezone AND p.anchor_day = c.anchor_day AND p.period_start <= h.hour
        ORDER BY p.period_start DESC LIMIT 1
    ) p1 ON true
    LEFT JOIN LATERAL (
        SELECT p.period_start FROM calendar_periods p
        WHERE p.timezone = c.timezone AND p.anchor_day = c.anchor_day
          AND p.period_start > h.hour AND p.period_start < h.hour + interval '1 hour'
        ORDER BY p.period_start LIMIT 1
    ) p2 ON true"""


def period_of(instant: str, hour: str = "l") -> str:
    """The period_start of `instant` (an expression in the hour of the `located` row `hour`): the
    period starting inside the hour once it has begun, else the one containing the hour's start while
    it lasts, else (no calendar, or outside its periods) the UTC calendar month."""
    return (f"CASE WHEN {instant} >= {hour}.p2_start THEN {hour}.p2_start "
            f"WHEN {instant} < {hour}.p1_end THEN {hour}.p1_start "
            f"ELSE date_trunc('month', {instant}, 'UTC') END")


def whole(hour: str = "l") -> str:
    """Whether every instant of the `located` row's hour is in one period (the hourly rollup row is enough)."""
    return (f"({hour}.p2_start IS NULL AND ({hour}.p1_end IS NULL OR {hour}.p1_end >= {hour}.hour + interval '1 hour'))")


def whole_or_archived(hour: str = "l") -> str:
    """`whole`, or the hour's month archived: its raw events, which would split it, are gone, so the
    hour counts whole in the period of its start, like a GPU slice (only a rebuild meets such hours:
    ingest refuses events older than the retention)."""
    return f"({whole(hour)} OR {hour}.archived)"


# --- requests and usage meters per period ------------------------------------------------------
# The rows to add up per period, from a relation of hourly sums (`hourly`: customer_id, hour and the
# counts) for the hours inside one period, and from a relation of events (`events`: customer_id, hour,
# occurred_at and the fields) for the hours a period boundary splits, both joined to a CTE `located`
# over their hours. Hours are grouped first, so only a split hour's events are placed one by one
# (ingest: the batch's rows; a rebuild: the rollups and the split hours' raw events).


def request_period_rows(hourly: str, events: str) -> str:
    """SELECT (customer_id, period_start, model, deployment_id, project, *REQUEST_COUNTS), in key order.
    An hour of an archived month counts whole (`whole_or_archived`)."""
    return f"""SELECT customer_id, period_start, model, deployment_id, project,
           {", ".join(f"sum({c})" for c in REQUEST_COUNTS)}
    FROM (
        SELECT h.customer_id, {period_of("h.hour")} AS period_start, h.model, h.deployment_id, h.project,
               {", ".join(f"h.{c}" for c in REQUEST_COUNTS)}
        FROM {hourly} h JOIN located l USING (customer_id, hour) WHERE {whole_or_archived()}
        UNION ALL
        SELECT e.customer_id, {period_of("e.occurred_at")}, e.model, e.deployment_id, e.project,
               {REQUEST_SUMS}
        FROM {events} e JOIN located l USING (customer_id, hour) WHERE NOT {whole_or_archived()}
        GROUP BY 1, 2, 3, 4, 5
    ) AS p
    GROUP BY 1, 2, 3, 4, 5
    ORDER BY 1, 2, 3, 4, 5"""


def usage_period_rows(hourly: str, events: str) -> str:
    """SELECT (customer_id, period_start, meter, quantity, events), in key order."""
    return f"""SELECT customer_id, period_start, meter, sum(quantity), sum(events)
    FROM (
        SELECT h.customer_id, {period_of("h.hour")} AS period_start, h.meter, h.quantity, h.events
        FROM {hourly} h JOIN located l USING (customer_id, hour) WHERE {whole_or_archived()}
        UNION ALL
        SELECT e.customer_id, {period_of("e.occurred_at")}, e.meter, sum(e.quantity), count(*)
        FROM {events} e JOIN located l USING (customer_id, hour) WHERE NOT {whole_or_archived()}
        GROUP BY 1, 2, 3
    ) AS p
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3"""


def gpu_period_rows(slices: str) -> str:
    """SELECT (customer_id, period_start, deployment_id, gpu_type, gpu_ms) from hourly GPU slices (an
    hour's slice counts in the period of the hour's start), in key order."""
    return f"""SELECT g.customer_id, {period_of("g.hour")}, g.deployment_id, g.gpu_type, sum(g.gpu_ms)
    FROM {slices} g JOIN located l USING (customer_id, hour)
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4"""


# --- tasks at outcome time -------------------------------------------------------------------------
# What a task adds to task_period_totals: one task of its outcome in the period of its finished_at,
# and its attempts (task_attempts rows) to that outcome's attempts when it succeeded or failed.
# `{touched}` selects (customer_id, task_id) of the tasks to look at; tasks whose contribution changed
# get the difference (their new share minus what counted_* says they added) and their counted_* updated.
TASK_PERIOD_CHANGES = f"""
WITH touched AS (
    {{touched}}
), current AS MATERIALIZED (
    SELECT o.customer_id, o.task_id, o.outcome, o.finished_at, date_trunc('hour', o.finished_at, 'UTC') AS hour,
           (SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id)::int
               AS attempts,
           o.counted_period, o.counted_outcome, o.counted_attempts
    FROM task_outcomes o JOIN touched t ON t.customer_id = o.customer_id AND t.task_id = o.task_id
), task_hours AS (
    SELECT DISTINCT customer_id, hour FROM current
), located AS (
    {located("task_hours")}
), changed AS MATERIALIZED (
    SELECT * FROM (
        SELECT c.*, {period_of("c.finished_at")} AS period_start
        FROM current c JOIN located l USING (customer_id, hour)
    ) n
    WHERE (period_start, outcome, attempts) IS DISTINCT FROM (counted_period, counted_outcome, counted_attempts)
), marked AS (
    UPDATE task_outcomes o
    SET counted_period = ch.period_start, counted_outcome = ch.outcome, counted_attempts = ch.attempts
    FROM changed ch WHERE o.customer_id = ch.customer_id AND o.task_id = ch.task_id
), moves AS (
    SELECT customer_id, period_start, outcome, attempts, 1 AS sign FROM changed
    UNION ALL
    SELECT customer_id, counted_period, counted_outcome, counted_attempts, -1 FROM changed
    WHERE counted_period IS NOT NULL
)
INSERT INTO task_period_totals AS t (customer_id, period_start, succeeded, failed, abandoned,
                                    succeeded_attempts, failed_attempts)
SELECT customer_id, period_start,
       coalesce(sum(sign) FILTER (WHERE outcome = 'succeeded'), 0),
       coalesce(sum(sign) FILTER (WHERE outcome = 'failed'), 0),
       coalesce(sum(sign) FILTER (WHERE outcome = 'abandoned'), 0),
       coalesce(sum(sign * attempts) FILTER (WHERE outcome = 'succeeded'), 0),
       coalesce(sum(sign * attempts) FILTER (WHERE outcome = 'failed'), 0)
FROM moves
GROUP BY customer_id, period_start
ORDER BY customer_id, period_start
ON CONFLICT (customer_id, period_start) DO UPDATE SET
    {add_counts("t", ("succeeded", "failed", "abandoned", "succeeded_attempts", "failed_attempts"))}
RETURNING customer_id, period_start, (succeeded, failed, abandoned, succeeded_attempts, failed_attempts) = (0, 0, 0, 0, 0)
"""
# A period every counted task has left: its row goes (a period without tasks has no row, as after a rebuild).
_DROP_EMPTY_TASK_TOTALS = """
DELETE FROM task_period_totals WHERE (customer_id, period_start) IN (SELECT * FROM unnest(%s::text[], %s::timestamptz[]))
  AND (succeeded, failed, abandoned, succeeded_attempts, failed_attempts) = (0, 0, 0, 0, 0)
"""
# The writer's: the tasks named by the batch's request and task events (staged, so a duplicate's task
# is looked at too: its share has not changed, nothing moves).
BATCH_TASK_CHANGES = TASK_PERIOD_CHANGES.replace(
    "{touched}", "SELECT DISTINCT customer_id, task_id FROM stage WHERE task_id IS NOT NULL")


def move_tasks(cur: psycopg.Cursor, statement: str, params: dict | None = None) -> int:
    """Run a TASK_PERIOD_CHANGES statement and drop the task totals rows it left at zero; the rows it wrote."""
    cur.execute(statement, params)
    rows = cur.fetchall()
    empty = [(customer, start) for customer, start, is_empty in rows if is_empty]
    if empty:
        cur.execute(_DROP_EMPTY_TASK_TOTALS, ([c for c, _ in empty], [s for _, s in empty]))
    return len(rows) - len(empty)


# --- rebuilding one customer ---------------------------------------------------------------------
# The same rules as ingest, read from what metering keeps per customer: whole hours from the hourly
# rollups (keys starting with customer_id), the hours a period boundary splits from the customer's raw
# events of those hours (unless their month was archived: such an hour counts whole in the period of its
# start). raw_events has no index by customer (only by time), so reading a customer's raw events alone
# would scan every customer's.

_SPLIT_RAW_EVENTS = """(
    SELECT e.customer_id, l.hour, e.occurred_at, {fields}
    FROM located l JOIN raw_events e
      ON e.customer_id = l.customer_id AND e.occurred_at >= l.hour AND e.occurred_at < l.hour + interval '1 hour'
    WHERE NOT {whole} AND e.type = '{type}'
)"""
_REBUILD_REQUESTS = f"""
WITH hourly AS (
    SELECT * FROM request_rollup_hourly WHERE customer_id = %(customer)s
), hours AS (
    SELECT DISTINCT customer_id, hour FROM hourly
), located AS (
    {located("hours", archived=True)}
)
INSERT INTO request_period_totals (customer_id, period_start, model, deployment_id, project, {", ".join(REQUEST_COUNTS)})
{request_period_rows("hourly", _SPLIT_RAW_EVENTS.format(fields=REQUEST_FIELDS, whole=whole_or_archived(), type="infermeter.request.v1"))}
"""
_REBUILD_USAGE = f"""
WITH hourly AS (
    SELECT * FROM usage_rollup_hourly WHERE customer_id = %(customer)s
), hours AS (
    SELECT DISTINCT customer_id, hour FROM hourly
), located AS (
    {located("hours", archived=True)}
)
INSERT INTO usage_period_totals (customer_id, period_start, meter, quantity, events)
{usage_period_rows("hourly", _SPLIT_RAW_EVENTS.format(fields=USAGE_FIELDS, whole=whole_or_archived(), type="infermeter.usage.v1"))}
"""
_REBUILD_GPU = f"""
WITH slices AS (
    SELECT * FROM gpu_ledger_hourly WHERE customer_id = %(customer)s AND customer_id <> ''
), hours AS (
    SELECT DISTINCT customer_id, hour FROM slices
), located AS (
    {located("hours")}
)
INSERT INTO gpu_period_totals (customer_id, period_start, deployment_id, gpu_type, gpu_ms)
{gpu_period_rows("slices")}
"""
_FORGET_TASK_SHARES = """
UPDATE task_outcomes SET counted_period = NULL, counted_outcome = NULL, counted_attempts = 0
WHERE customer_id = %(customer)s AND counted_period IS NOT NULL
"""
_REBUILD_TASKS = TASK_PERIOD_CHANGES.replace(
    "{touched}", "SELECT customer_id, task_id FROM task_outcomes WHERE customer_id = %(customer)s")

TOTALS_TABLES = ("request_period_totals", "usage_period_totals", "task_period_totals", "gpu_period_totals")
HAS_USAGE_SQL = " OR ".join(
    f"EXISTS (SELECT 1 FROM {table} WHERE customer_id = %(customer)s)"
    for table in (*TOTALS_TABLES, "request_rollup_hourly", "usage_rollup_hourly", "task_outcomes")
) + " OR EXISTS (SELECT 1 FROM gpu_ledger_hourly WHERE customer_id = %(customer)s AND customer_id <> '')"


@dataclass(frozen=True)
class RebuildResult:
    """The rows of each totals table a rebuild wrote for one customer (0 everywhere: nothing metered)."""

    customer_id: str
    request_rows: int = 0
    usage_rows: int = 0
    task_rows: int = 0
    gpu_rows: int = 0

    @property
    def rows(self) -> int:
        return self.request_rows + self.usage_rows + self.task_rows + self.gpu_rows

    def as_dict(self) -> dict:
        return {"customer_id": self.customer_id, "request_rows": self.request_rows, "usage_rows": self.usage_rows,
                "task_rows": self.task_rows, "gpu_rows": self.gpu_rows}


def has_usage(conn: psycopg.Connection, customer_id: str) -> bool:
    """Whether metering holds anything of the customer (rollups, tasks, dedicated GPU time, totals)."""
    return conn.execute(f"SELECT {HAS_USAGE_SQL}", {"customer": customer_id}).fetchone()[0]


def rebuild(conn: psycopg.Connection, customer_id: str) -> RebuildResult:
    """Recompute one customer's period totals under its current calendar, inside the caller's
    transaction (the caller commits), holding the calendar lock exclusive until then."""
    params = {"customer": customer_id}
    with conn.cursor() as cur:
        cur.execute(LOCK_CALENDARS)
        for table in TOTALS_TABLES:
            cur.execute(f"DELETE FROM {table} WHERE customer_id = %(customer)s", params)
        counts = []
        for statement in (_REBUILD_REQUESTS, _REBUILD_USAGE, _REBUILD_GPU):
            cur.execute(statement, params)
            counts.append(cur.rowcount)
        cur.execute(_FORGET_TASK_SHARES, params)
        counts.append(move_tasks(cur, _REBUILD_TASKS, params))
    requests, usage, gpu, tasks = counts
    return RebuildResult(customer_id, request_rows=requests, usage_rows=usage, task_rows=tasks, gpu_rows=gpu)


def customers_to_rebuild(conn: psycopg.Connection) -> list[str]:
    """Every customer metering holds anything of, or totals or a calendar for, in order."""
    rows = conn.execute(
        " UNION ".join(f"SELECT DISTINCT customer_id FROM {table}" for table in (
            *TOTALS_TABLES, "request_rollup_hourly", "usage_rollup_hourly", "task_outcomes", "customer_calendars"))
        + " UNION SELECT DISTINCT customer_id FROM gpu_ledger_hourly WHERE customer_id <> '' ORDER BY 1"
    ).fetchall()
    return [customer for (customer,) in rows]
