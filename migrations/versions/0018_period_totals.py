"""metering: billing calendars as data and period totals kept at ingest

Revision ID: 0018
Revises: 0017

Metering keeps, in the same transaction as the hourly rollups, totals per customer x billing period
(docs/metering.md, "Period totals"): request_period_totals (per model x deployment x project),
usage_period_totals (per meter), task_period_totals (tasks by outcome at outcome time) and
gpu_period_totals (dedicated deployments' GPU-ms). The periods reach metering as data:
customer_calendars (a customer's time zone and anchor day) and calendar_periods (each schedule's
periods as UTC instants, computed by billing's period function). task_outcomes gains what each task
adds to the task totals (counted_period, counted_outcome, counted_attempts).

The upgrade fills all of them for what is already stored: every billed customer's calendar from
billing_customers (the periods of its schedule from `billing.periods`, labelled 1970-01 to 2100-12),
then the totals under those calendars (UTC calendar months for customers without one): whole hours
from the hourly rollups, the hours a period boundary splits from raw events (an hour of a month
already archived counts whole in the period of its start: its raw events are gone), GPU-ms from
gpu_ledger_hourly, tasks from task_outcomes and task_attempts. The SQL is this revision's own (the
rules of metering.period_totals at this revision), so later changes of that module do not change
what this migration does.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

SPAN = ("1970-01", "2100-12")  # the labels of the periods kept per schedule (metering.calendars.SPAN)
_COUNTS = ("requests", "requests_ok", "requests_error", "requests_cancelled", "requests_rejected",
           "input_tokens", "cached_input_tokens", "output_tokens",
           "retry_requests", "retry_input_tokens", "retry_cached_input_tokens", "retry_output_tokens")


def _counts(*names: str) -> list[sa.Column]:
    return [sa.Column(n, sa.BigInteger(), server_default="0", nullable=False) for n in names]


def _key(name: str) -> sa.Column:
    return sa.Column(name, sa.Text(collation="C"), nullable=False)


def _at(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.add_column("task_outcomes", _at("counted_period", nullable=True))
    op.add_column("task_outcomes", sa.Column("counted_outcome", sa.Text(), nullable=True))
    op.add_column("task_outcomes", sa.Column("counted_attempts", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "customer_calendars",
        _key("customer_id"),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("anchor_day", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("customer_id", name="customer_calendars_pkey"),
    )
    op.create_table(
        "calendar_periods",
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("anchor_day", sa.Integer(), nullable=False),
        _at("period_start"),
        _at("period_end"),
        sa.PrimaryKeyConstraint("timezone", "anchor_day", "period_start", name="calendar_periods_pkey"),
    )
    op.create_table(
        "request_period_totals",
        _key("customer_id"), _at("period_start"), _key("model"), _key("deployment_id"),
        sa.Column("project", sa.Text(collation="C"), server_default="", nullable=False),
        *_counts(*_COUNTS),
        sa.PrimaryKeyConstraint("customer_id", "period_start", "model", "deployment_id", "project",
                                name="request_period_totals_pkey"),
    )
    op.create_table(
        "usage_period_totals",
        _key("customer_id"), _at("period_start"), _key("meter"),
        sa.Column("quantity", sa.Numeric(precision=38, scale=12), server_default="0", nullable=False),
        *_counts("events"),
        sa.PrimaryKeyConstraint("customer_id", "period_start", "meter", name="usage_period_totals_pkey"),
    )
    op.create_table(
        "task_period_totals",
        _key("customer_id"), _at("period_start"),
        *_counts("succeeded", "failed", "abandoned", "succeeded_attempts", "failed_attempts"),
        sa.PrimaryKeyConstraint("customer_id", "period_start", name="task_period_totals_pkey"),
    )
    op.create_table(
        "gpu_period_totals",
        _key("customer_id"), _at("period_start"), _key("deployment_id"), _key("gpu_type"),
        *_counts("gpu_ms"),
        sa.PrimaryKeyConstraint("customer_id", "period_start", "deployment_id", "gpu_type",
                                name="gpu_period_totals_pkey"),
    )
    _fill()


def downgrade() -> None:
    for table in ("gpu_period_totals", "task_period_totals", "usage_period_totals", "request_period_totals",
                  "calendar_periods", "customer_calendars"):
        op.drop_table(table)
    for column in ("counted_attempts", "counted_outcome", "counted_period"):
        op.drop_column("task_outcomes", column)


# --- filling the new tables for what is already stored ------------------------------------------

_LOCATED = """
SELECT h.customer_id, h.hour, p1.period_start AS p1_start, p1.period_end AS p1_end, p2.period_start AS p2_start,
       (SELECT 1 FROM archived_months a WHERE a.month = date_trunc('month', h.hour, 'UTC')) IS NOT NULL AS archived
FROM hours h
LEFT JOIN customer_calendars c ON c.customer_id = h.customer_id
LEFT JOIN LATERAL (SELECT p.period_start, p.period_end FROM calendar_periods p
                   WHERE p.timezone = c.timezone AND p.anchor_day = c.anchor_day AND p.period_start <= h.hour
                   ORDER BY p.period_start DESC LIMIT 1) p1 ON true
LEFT JOIN LATERAL (SELECT p.period_start FROM calendar_periods p
                   WHERE p.timezone = c.timezone AND p.anchor_day = c.anchor_day
                     AND p.period_start > h.hour AND p.period_start < h.hour + interval '1 hour'
                   ORDER BY p.period_start LIMIT 1) p2 ON true"""


def _period(instant: str, row: str) -> str:
    return (f"CASE WHEN {instant} >= {row}.p2_start THEN {row}.p2_start WHEN {instant} < {row}.p1_end "
            f"THEN {row}.p1_start ELSE date_trunc('month', {instant}, 'UTC') END")


# an hour inside one period, or of an archived month (its raw events are gone: it counts whole in the
# period of its start)
_WHOLE = "(l.p2_start IS NULL AND (l.p1_end IS NULL OR l.p1_end >= l.hour + interval '1 hour') OR l.archived)"
_SPLIT_RAW = ("FROM located l JOIN raw_events e ON e.customer_id = l.customer_id AND e.occurred_at >= l.hour "
              "AND e.occurred_at < l.hour + interval '1 hour' WHERE NOT " + _WHOLE + " AND e.type = '{type}'")

_FILL_REQUESTS = f"""
WITH hours AS (SELECT DISTINCT customer_id, hour FROM request_rollup_hourly), located AS ({_LOCATED}),
split AS (
    SELECT e.customer_id, {_period("e.occurred_at", "l")} AS period_start, e.payload->'data'->>'model' AS model,
           e.payload->'data'->>'deployment_id' AS deployment_id, e.payload->'data'->>'status' AS status,
           coalesce((e.payload->'data'->>'attempt')::int, 1) AS attempt,
           (e.payload->'data'->>'input_tokens')::bigint AS input_tokens,
           (e.payload->'data'->>'cached_input_tokens')::bigint AS cached_input_tokens,
           (e.payload->'data'->>'output_tokens')::bigint AS output_tokens
    {_SPLIT_RAW.format(type="infermeter.request.v1")}
)
INSERT INTO request_period_totals (customer_id, period_start, model, deployment_id, {", ".join(_COUNTS)})
SELECT customer_id, period_start, model, deployment_id, {", ".join(f"sum({c})" for c in _COUNTS)} FROM (
    SELECT r.customer_id, {_period("r.hour", "l")} AS period_start, r.model, r.deployment_id,
           {", ".join(f"r.{c}" for c in _COUNTS)}
    FROM request_rollup_hourly r JOIN located l USING (customer_id, hour) WHERE {_WHOLE}
    UNION ALL
    SELECT customer_id, period_start, model, deployment_id, count(*),
           count(*) FILTER (WHERE status = 'ok'), count(*) FILTER (WHERE status = 'error'),
           count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'rejected'),
           sum(input_tokens), sum(cached_input_tokens), sum(output_tokens),
           count(*) FILTER (WHERE attempt > 1), coalesce(sum(input_tokens) FILTER (WHERE attempt > 1), 0),
           coalesce(sum(cached_input_tokens) FILTER (WHERE attempt > 1), 0),
           coalesce(sum(output_tokens) FILTER (WHERE attempt > 1), 0)
    FROM split GROUP BY 1, 2, 3, 4
) u GROUP BY 1, 2, 3, 4
"""
_FILL_USAGE = f"""
WITH hours AS (SELECT DISTINCT customer_id, hour FROM usage_rollup_hourly), located AS ({_LOCATED})
INSERT INTO usage_period_totals (customer_id, period_start, meter, quantity, events)
SELECT customer_id, period_start, meter, sum(quantity), sum(events) FROM (
    SELECT u.customer_id, {_period("u.hour", "l")} AS period_start, u.meter, u.quantity, u.events
    FROM usage_rollup_hourly u JOIN located l USING (customer_id, hour) WHERE {_WHOLE}
    UNION ALL
    SELECT e.customer_id, {_period("e.occurred_at", "l")}, e.payload->'data'->>'meter',
           (e.payload->'data'->>'quantity')::numeric, 1
    {_SPLIT_RAW.format(type="infermeter.usage.v1")}
) u GROUP BY 1, 2, 3
"""
_FILL_GPU = f"""
WITH hours AS (SELECT DISTINCT customer_id, hour FROM gpu_ledger_hourly WHERE customer_id <> ''),
located AS ({_LOCATED})
INSERT INTO gpu_period_totals (customer_id, period_start, deployment_id, gpu_type, gpu_ms)
SELECT g.customer_id, {_period("g.hour", "l")}, g.deployment_id, g.gpu_type, sum(g.gpu_ms)
FROM gpu_ledger_hourly g JOIN located l USING (customer_id, hour) GROUP BY 1, 2, 3, 4
"""
_COUNT_TASKS = f"""
WITH counted AS (
    SELECT o.customer_id, o.task_id, o.outcome, date_trunc('hour', o.finished_at, 'UTC') AS hour, o.finished_at,
           (SELECT count(*) FROM task_attempts a WHERE a.customer_id = o.customer_id AND a.task_id = o.task_id)::int
               AS attempts
    FROM task_outcomes o
), hours AS (SELECT DISTINCT customer_id, hour FROM counted), located AS ({_LOCATED})
UPDATE task_outcomes o SET counted_period = {_period("c.finished_at", "l")}, counted_outcome = c.outcome,
                           counted_attempts = c.attempts
FROM counted c JOIN located l USING (customer_id, hour)
WHERE o.customer_id = c.customer_id AND o.task_id = c.task_id
"""
_FILL_TASKS = """
INSERT INTO task_period_totals (customer_id, period_start, succeeded, failed, abandoned, succeeded_attempts,
                                failed_attempts)
SELECT customer_id, counted_period, count(*) FILTER (WHERE counted_outcome = 'succeeded'),
       count(*) FILTER (WHERE counted_outcome = 'failed'), count(*) FILTER (WHERE counted_outcome = 'abandoned'),
       coalesce(sum(counted_attempts) FILTER (WHERE counted_outcome = 'succeeded'), 0),
       coalesce(sum(counted_attempts) FILTER (WHERE counted_outcome = 'failed'), 0)
FROM task_outcomes GROUP BY 1, 2
"""


def _fill() -> None:
    from billing.periods import periods_between

    op.execute("INSERT INTO customer_calendars (customer_id, timezone, anchor_day) "
               "SELECT customer_id, timezone, anchor_day FROM billing_customers")
    bind = op.get_bind()
    schedules = bind.execute(sa.text("SELECT DISTINCT timezone, anchor_day FROM customer_calendars "
                                     "WHERE (timezone, anchor_day) <> ('UTC', 1)")).fetchall()
    for timezone, anchor_day in schedules:
        rows = [{"tz": timezone, "anchor": anchor_day, "start": p.start, "end": p.end}
                for p in periods_between(*SPAN, timezone, anchor_day)]
        bind.execute(sa.text("INSERT INTO calendar_periods (timezone, anchor_day, period_start, period_end) "
                             "VALUES (:tz, :anchor, :start, :end)"), rows)
    for statement in (_FILL_REQUESTS, _FILL_USAGE, _FILL_GPU, _COUNT_TASKS, _FILL_TASKS):
        op.execute(statement)
