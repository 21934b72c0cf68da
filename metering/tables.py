"""Metering's tables (SQLAlchemy Core). The Alembic migrations create exactly these.

Times are timestamptz (aware UTC); hours are the start of a half-open [hour, hour + 1h) window.
Token counts are bigint; other quantities are NUMERIC with the project-wide scale.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import Key, Quantity, metadata, timestamp_column

_counts = lambda *names: [Column(n, BigInteger, nullable=False, server_default="0") for n in names]  # noqa: E731

# Every accepted event, whole, partitioned by month of its event time (raw_events_YYYY_MM).
# No unique key here: the (source, id) identity is enforced by event_keys in the same statement.
raw_events = Table(
    "raw_events",
    metadata,
    timestamp_column("occurred_at", nullable=False),
    Column("source", Key, nullable=False),
    Column("event_id", Key, nullable=False),
    Column("type", Text, nullable=False),
    Column("customer_id", Key, nullable=False),
    timestamp_column("received_at", nullable=False, server_default=func.now()),
    Column("payload", JSONB, nullable=False),
    postgresql_partition_by="RANGE (occurred_at)",
)
# Identity lives in event_keys; raw rows only need cheap time-range scans within a partition.
Index("raw_events_occurred_brin", raw_events.c.occurred_at, postgresql_using="brin")
# The operations page reads recent arrivals (ingest rate, metering delay); rows arrive in received_at order.
Index("raw_events_received_brin", raw_events.c.received_at, postgresql_using="brin")

# The identity of every accepted event, CloudEvents (source, id): the deduplication key. Partitioned
# like raw_events, by UTC month of event time (event_keys_YYYY_MM, created with raw_events' partition
# of the month, migration 0014), so a month leaves the store whole (`infermeter metering archive`).
# Each partition's primary key (source, event_id) is the arbiter of the writer's ON CONFLICT DO
# NOTHING: identity is (source, id) within a month of event time (docs/metering.md, "Retention").
event_keys = Table(
    "event_keys",
    metadata,
    Column("source", Key, nullable=False),
    Column("event_id", Key, nullable=False),
    timestamp_column("occurred_at", nullable=False),
    postgresql_partition_by="RANGE (occurred_at)",
)

# Months whose raw events went to a Parquet file and whose raw_events / event_keys partitions were
# dropped (`infermeter metering archive`, migration 0014): the writer never creates their partitions
# again, and a later archive of the same month never overwrites the file.
archived_months = Table(
    "archived_months",
    metadata,
    timestamp_column("month", nullable=False),  # first instant of the UTC month
    Column("file", Text, nullable=False),
    Column("events", BigInteger, nullable=False),
    # sum of the first 64 bits of md5(source || x'1f' || event_id) over the month's events, mod 2^64, hex
    Column("key_checksum", Text, nullable=False),
    timestamp_column("archived_at", nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("month", name="archived_months_pkey"),
)

# infermeter.request.v1, per customer x model x deployment x hour of event time x project.
request_rollup_hourly = Table(
    "request_rollup_hourly",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("model", Key, nullable=False),
    Column("deployment_id", Key, nullable=False),
    timestamp_column("hour", nullable=False),
    # the API key's project (request.v1 `project`, migration 0020); '' = none (events without one)
    Column("project", Key, nullable=False, server_default=""),
    *_counts(
        "requests",
        "requests_ok",
        "requests_error",
        "requests_cancelled",
        "requests_rejected",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "retry_requests",
        "retry_input_tokens",
        "retry_cached_input_tokens",
        "retry_output_tokens",
    ),
    # the sums a rating reads ride in the key's index (migration 0005: index-only sums in customer order)
    PrimaryKeyConstraint(
        "customer_id", "model", "deployment_id", "hour", "project", name="request_rollup_hourly_pkey",
        postgresql_include=["requests", "input_tokens", "cached_input_tokens", "output_tokens"],
    ),
)
Index("request_rollup_hourly_hour", request_rollup_hourly.c.hour)

# infermeter.request.v1 events that carry a `region` (the serving replica's, data residency), per
# customer x model x deployment x region x hour of event time (migration 0009). Events without a
# region are counted in request_rollup_hourly only: the difference between the two is the
# "no region" share (metering.queries.usage, group by region). Written in the same statement.
request_region_hourly = Table(
    "request_region_hourly",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("model", Key, nullable=False),
    Column("deployment_id", Key, nullable=False),
    Column("region", Key, nullable=False),
    timestamp_column("hour", nullable=False),
    *_counts("requests", "requests_rejected", "input_tokens", "cached_input_tokens", "output_tokens"),
    PrimaryKeyConstraint(
        "customer_id", "model", "deployment_id", "region", "hour", name="request_region_hourly_pkey"
    ),
)
Index("request_region_hourly_hour", request_region_hourly.c.hour)

# Requests that carry a task id, per task attempt (attempt >= 1).
task_attempts = Table(
    "task_attempts",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("task_id", Key, nullable=False),
    Column("attempt", Integer, nullable=False),
    *_counts("requests", "input_tokens", "cached_input_tokens", "output_tokens"),
    timestamp_column("first_request_at", nullable=False),
    timestamp_column("last_request_at", nullable=False),
    PrimaryKeyConstraint("customer_id", "task_id", "attempt", name="task_attempts_pkey"),
)
# a task's timeout runs from its first request (migration 0009: tasks whose deadline falls in a period)
Index("task_attempts_first_request", task_attempts.c.first_request_at)

# infermeter.task.v1: one outcome per task; a later finished_at replaces an earlier one.
task_outcomes = Table(
    "task_outcomes",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("task_id", Key, nullable=False),
    Column("outcome", Text, nullable=False),
    timestamp_column("finished_at", nullable=False),
    Column("source", Key, nullable=False),
    Column("event_id", Key, nullable=False),
    Column("failure_cause", Text),  # the outcome's failure_cause (migration 0008), NULL when not given
    # What this task adds to task_period_totals now (migration 0018): the period its outcome counted in,
    # that outcome and its attempts then; NULL/0 until counted. A later outcome or attempt changes what
    # it adds: the writer applies the difference in the same transaction (metering.period_totals).
    timestamp_column("counted_period"),
    Column("counted_outcome", Text),
    Column("counted_attempts", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("customer_id", "task_id", name="task_outcomes_pkey"),
)
Index("task_outcomes_finished", task_outcomes.c.finished_at)

# infermeter.task.v1, every report kept with its source (migration 0009): who said what about a task.
# task_outcomes keeps the latest report from anyone; a price book that trusts only some sources
# (docs/billing.md, "Trusted task outcomes") reads these instead.
task_outcome_reports = Table(
    "task_outcome_reports",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("task_id", Key, nullable=False),
    Column("source", Key, nullable=False),
    Column("event_id", Key, nullable=False),
    Column("outcome", Text, nullable=False),
    timestamp_column("finished_at", nullable=False),
    PrimaryKeyConstraint("customer_id", "task_id", "source", "event_id", name="task_outcome_reports_pkey"),
)
Index("task_outcome_reports_finished", task_outcome_reports.c.finished_at)

# infermeter.usage.v1 that name a task: tool and verification usage per task and meter.
task_usage = Table(
    "task_usage",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("task_id", Key, nullable=False),
    Column("meter", Key, nullable=False),
    Column("quantity", Quantity, nullable=False, server_default="0"),
    PrimaryKeyConstraint("customer_id", "task_id", "meter", name="task_usage_pkey"),
)

# infermeter.usage.v1, per customer x meter x hour of event time.
usage_rollup_hourly = Table(
    "usage_rollup_hourly",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("meter", Key, nullable=False),
    timestamp_column("hour", nullable=False),
    Column("quantity", Quantity, nullable=False, server_default="0"),
    *_counts("events"),
    PrimaryKeyConstraint("customer_id", "meter", "hour", name="usage_rollup_hourly_pkey"),
)

# infermeter.replica.v1 intervals split at hour boundaries. customer_id '' = the shared pool.
# gpu_ms = interval milliseconds x gpu_count; busy_ms = busy wall milliseconds; token counters split in
# proportion. The engine state (migration 0008; 0 for intervals that did not report it): wall_ms = the
# interval's wall milliseconds (gpu_ms / wall_ms = gpu_count), kv_cache_gpu_ms = gpu_ms x mean KV-cache
# usage (memory-time held), queue_ms / running_ms = request-milliseconds waiting / running (the
# time-averaged queue and batch x wall milliseconds).
gpu_ledger_hourly = Table(
    "gpu_ledger_hourly",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("deployment_id", Key, nullable=False),
    Column("replica_id", Key, nullable=False),
    Column("gpu_type", Key, nullable=False),
    timestamp_column("hour", nullable=False),
    *_counts("gpu_ms", "busy_ms", "prompt_tokens", "generation_tokens", "intervals",
             "wall_ms", "kv_cache_gpu_ms", "queue_ms", "running_ms"),
    PrimaryKeyConstraint(
        "customer_id", "deployment_id", "replica_id", "gpu_type", "hour", name="gpu_ledger_hourly_pkey"
    ),
)

# The admission-time predictions of infermeter.request.v1 events (`data.prediction`) scored against the
# request's actual output, per customer x model x hour of event time (migration 0019), written in the
# same statement as the rollups from the fresh events only: a duplicate is never scored twice. Sums,
# so any window of hours adds up (metering.prediction_scores); rejected requests are not scored.
prediction_scores_hourly = Table(
    "prediction_scores_hourly",
    metadata,
    Column("customer_id", Key, nullable=False),
    Column("model", Key, nullable=False),
    timestamp_column("hour", nullable=False),
    *_counts("requests", "failures", "abs_error_p50", "under_p90", "under_p99"),
    *(Column(n, Quantity, nullable=False, server_default="0")
      for n in ("pinball_p90", "pinball_p99", "abs_error_cached_fraction", "brier_failure")),
    PrimaryKeyConstraint("customer_id", "model", "hour", name="prediction_scores_hourly_pkey"),
)
Index("prediction_scores_hourly_hour", prediction_scores_hourly.c.hour)

# --- billing periods as data, and the period totals kept at ingest (migration 0018) ---------------
# metering imports no billing code: billing hands each customer's schedule and the schedule's periods
# over through metering.calendars.set_calendar. A customer without a row is kept by UTC calendar month.

# A customer's billing schedule: IANA time zone and anchor day (1..31).
customer_calendars = Table(
    "customer_calendars",
    metadata,
    Column("customer_id", Key, primary_key=True),
    Column("timezone", Text, nullable=False),
    Column("anchor_day", Integer, nullable=False),
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
)

# The periods of every schedule in use but ('UTC', 1) (UTC calendar months need no rows), as exact UTC
# instants [period_start, period_end) computed by billing's period function: those labelled 1970-01 to
# 2100-12 (metering.calendars.SPAN). Consecutive rows of a schedule tile time.
calendar_periods = Table(
    "calendar_periods",
    metadata,
    Column("timezone", Text, nullable=False),
    Column("anchor_day", Integer, nullable=False),
    timestamp_column("period_start", nullable=False),
    timestamp_column("period_end", nullable=False),
    PrimaryKeyConstraint("timezone", "anchor_day", "period_start", name="calendar_periods_pkey"),
)

# infermeter.request.v1 per customer x billing period x model x deployment x project, every meter of
# request_rollup_hourly; written in the same statement as the hourly rollups. project '' = none.
request_period_totals = Table(
    "request_period_totals",
    metadata,
    Column("customer_id", Key, nullable=False),
    timestamp_column("period_start", nullable=False),
    Column("model", Key, nullable=False),
    Column("deployment_id", Key, nullable=False),
    Column("project", Key, nullable=False, server_default=""),
    *_counts(*(c.name for c in request_rollup_hourly.c
               if c.name not in ("customer_id", "model", "deployment_id", "hour", "project"))),
    PrimaryKeyConstraint("customer_id", "period_start", "model", "deployment_id", "project",
                         name="request_period_totals_pkey"),
)

# infermeter.usage.v1 per customer x billing period x meter.
usage_period_totals = Table(
    "usage_period_totals",
    metadata,
    Column("customer_id", Key, nullable=False),
    timestamp_column("period_start", nullable=False),
    Column("meter", Key, nullable=False),
    Column("quantity", Quantity, nullable=False, server_default="0"),
    *_counts("events"),
    PrimaryKeyConstraint("customer_id", "period_start", "meter", name="usage_period_totals_pkey"),
)

# Tasks by outcome, in the period of the outcome's finished_at (task_outcomes' latest outcome), and the
# attempts of the succeeded and of the failed ones (abandoned tasks' attempts are not counted).
task_period_totals = Table(
    "task_period_totals",
    metadata,
    Column("customer_id", Key, nullable=False),
    timestamp_column("period_start", nullable=False),
    *_counts("succeeded", "failed", "abandoned", "succeeded_attempts", "failed_attempts"),
    PrimaryKeyConstraint("customer_id", "period_start", name="task_period_totals_pkey"),
)

# GPU-ms of dedicated deployments (replica intervals with a customer_id) per owner x billing period x
# deployment x GPU type; an hour's slice counts in the period that contains the hour's start (the
# billing edge-hour rule). The shared pool's attribution stays on gpu_ledger_hourly.
gpu_period_totals = Table(
    "gpu_period_totals",
    metadata,
    Column("customer_id", Key, nullable=False),
    timestamp_column("period_start", nullable=False),
    Column("deployment_id", Key, nullable=False),
    Column("gpu_type", Key, nullable=False),
    *_counts("gpu_ms"),
    PrimaryKeyConstraint("customer_id", "period_start", "deployment_id", "gpu_type", name="gpu_period_totals_pkey"),
)

# Kafka offsets of the metering consumers, written in the same transaction as the events.
consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("group_id", Key, nullable=False),
    Column("topic", Key, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("group_id", "topic", "partition", name="consumer_offsets_pkey"),
)

# Events that failed validation, with the reason and the payload as received.
dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    timestamp_column("received_at", nullable=False, server_default=func.now()),
    Column("topic", Text),
    Column("partition", Integer),
    Column("offset", BigInteger),
    Column("reason", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    Column("event_source", Text),
    Column("event_id", Text),
    Column("customer_id", Text),
    Column("payload", LargeBinary, nullable=False),
    UniqueConstraint("topic", "partition", "offset", name="dead_letters_position"),
)
Index("dead_letters_received", dead_letters.c.received_at)

# Per `events ingest` run (Kafka header infermeter-ingest-id): what metering made of its events.
ingest_receipts = Table(
    "ingest_receipts",
    metadata,
    Column("ingest_id", Key, primary_key=True),
    *_counts("accepted", "duplicates", "rejected"),
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
)

__all__ = [name for name, value in globals().items() if isinstance(value, Table)] + ["MetaData", "text"]
