"""Write a batch to Postgres exactly once: events, rollups, ledgers, admission predictions' scores,
dead letters, receipts and the consumer's Kafka offsets, all in ONE transaction.

Exactly once rests on two guards:
1. an offset fence: the transaction locks this group's offset rows for the batch's partitions
   and drops messages below the stored next offset (already written by someone), so a batch
   replayed after a crash or a rebalance is written at most once;
2. the (source, id) key of `event_keys` (each monthly partition's, by event time): a duplicate
   event (same identity in the same month of event time; any offset, any topic) adds nothing to any
   rollup.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from infermeter.times import month_start, next_month
from metering.kafka_types import Message, TopicPartition
from metering.period_totals import (
    BATCH_TASK_CHANGES,
    LOCK_CALENDARS_SHARED,
    LOCK_TASK_CUSTOMERS,
    REQUEST_COUNTS,
    REQUEST_FIELDS,
    REQUEST_SUMS,
    REQUEST_SUMS_NAMED,
    USAGE_FIELDS,
    add_counts,
    gpu_period_rows,
    located,
    move_tasks,
    request_period_rows,
    usage_period_rows,
)
from metering.prediction_scores import SCORES_CTE
from metering.processor import INGEST_ID_HEADER, ProcessedBatch, process

STAGE_COLUMNS = ("seq", "source", "event_id", "type", "customer_id", "occurred_at", "payload", "task_id")
GPU_STAGE_COLUMNS = (
    "seq", "customer_id", "deployment_id", "replica_id", "gpu_type", "hour",
    "gpu_ms", "busy_ms", "prompt_tokens", "generation_tokens", "wall_ms", "kv_cache_gpu_ms", "queue_ms", "running_ms",
)

CREATE_STAGE = """
CREATE TEMP TABLE IF NOT EXISTS stage (
    seq int NOT NULL, source text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL, type text NOT NULL,
    customer_id text COLLATE "C" NOT NULL, occurred_at timestamptz NOT NULL, payload text NOT NULL,
    task_id text COLLATE "C"
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS stage_gpu (
    seq int NOT NULL, customer_id text COLLATE "C" NOT NULL, deployment_id text COLLATE "C" NOT NULL,
    replica_id text COLLATE "C" NOT NULL, gpu_type text COLLATE "C" NOT NULL, hour timestamptz NOT NULL,
    gpu_ms bigint NOT NULL, busy_ms bigint NOT NULL, prompt_tokens bigint NOT NULL, generation_tokens bigint NOT NULL,
    wall_ms bigint NOT NULL, kv_cache_gpu_ms bigint NOT NULL, queue_ms bigint NOT NULL, running_ms bigint NOT NULL
) ON COMMIT DELETE ROWS;
"""

_ADD = add_counts
_REQUEST_COUNTS = REQUEST_COUNTS
_REGION_COUNTS = ("requests", "requests_rejected", "input_tokens", "cached_input_tokens", "output_tokens")
_GPU_COUNTS = ("gpu_ms", "busy_ms", "prompt_tokens", "generation_tokens", "intervals",
               "wall_ms", "kv_cache_gpu_ms", "queue_ms", "running_ms")

# The period totals (metering.period_totals), extra CTEs of the same statement: each distinct
# (customer, UTC hour) of the fresh request and usage events and dedicated GPU slices is located among
# its customer's periods once, then each event counts in the period of its occurred_at, each GPU slice
# in the period of its hour's start.
PERIOD_TOTALS_CTES = f"""
), gpu_slices AS (
    SELECT g.customer_id, g.hour, g.deployment_id, g.gpu_type, g.gpu_ms
    FROM stage_gpu g JOIN fresh f USING (seq) WHERE g.customer_id <> ''
), usage_hours AS (
    SELECT customer_id, hour, meter, sum(quantity) AS quantity, count(*) AS events FROM used GROUP BY 1, 2, 3
), period_hours AS (
    SELECT customer_id, hour FROM request_hours
    UNION
    SELECT customer_id, hour FROM usage_hours
    UNION
    SELECT customer_id, hour FROM gpu_slices
), located AS (
    {located("period_hours")}
), request_periods AS (
    INSERT INTO request_period_totals AS rp (customer_id, period_start, model, deployment_id, project,
                                             {", ".join(_REQUEST_COUNTS)})
    {request_period_rows("request_hours", "req")}
    ON CONFLICT (customer_id, period_start, model, deployment_id, project) DO UPDATE SET {_ADD("rp", _REQUEST_COUNTS)}
), usage_periods AS (
    INSERT INTO usage_period_totals AS up (customer_id, period_start, meter, quantity, events)
    {usage_period_rows("usage_hours", "used")}
    ON CONFLICT (customer_id, period_start, meter) DO UPDATE SET {_ADD("up", ("quantity", "events"))}
), gpu_periods AS (
    INSERT INTO gpu_period_totals AS gp (customer_id, period_start, deployment_id, gpu_type, gpu_ms)
    {gpu_period_rows("gpu_slices")}
    ON CONFLICT (customer_id, period_start, deployment_id, gpu_type) DO UPDATE SET {_ADD("gp", ("gpu_ms",))}
"""

# One statement: claim identities, then every table fed from the fresh events only. Every upsert
# visits its rows in key order, so concurrent writers lock shared rows in one order (no deadlock).
WRITE_BATCH_TEMPLATE = f"""
WITH fresh_keys AS (
    INSERT INTO event_keys (source, event_id, occurred_at)
    SELECT source, event_id, occurred_at FROM stage
    ORDER BY source, event_id
    ON CONFLICT DO NOTHING
    RETURNING source, event_id
), fresh AS MATERIALIZED (
    SELECT s.seq, s.source, s.event_id, s.type, s.customer_id, s.occurred_at,
           date_trunc('hour', s.occurred_at) AS hour, s.payload::jsonb AS payload
    FROM stage s JOIN fresh_keys k USING (source, event_id)
), req AS (
    SELECT customer_id, occurred_at, hour,
           {REQUEST_FIELDS}
    FROM fresh WHERE type = 'infermeter.request.v1'
), outcome AS (
    SELECT customer_id, source, event_id, payload->'data'->>'task_id' AS task_id,
           payload->'data'->>'outcome' AS outcome, (payload->'data'->>'finished_at')::timestamptz AS finished_at,
           payload->'data'->>'failure_cause' AS failure_cause
    FROM fresh WHERE type = 'infermeter.task.v1'
), used AS (
    SELECT customer_id, occurred_at, hour, {USAGE_FIELDS}
    FROM fresh WHERE type = 'infermeter.usage.v1'
), raw AS (
    INSERT INTO raw_events (occurred_at, source, event_id, type, customer_id, payload)
    SELECT occurred_at, source, event_id, type, customer_id, payload FROM fresh
{{request_hours}}), requests AS (
    INSERT INTO request_rollup_hourly AS r (customer_id, model, deployment_id, hour, project,
                                            {", ".join(_REQUEST_COUNTS)})
    {{request_rollup_rows}}
    ON CONFLICT (customer_id, model, deployment_id, hour, project) DO UPDATE SET {_ADD("r", _REQUEST_COUNTS)}
), regions AS (
    INSERT INTO request_region_hourly AS rg (customer_id, model, deployment_id, region, hour, {", ".join(_REGION_COUNTS)})
    SELECT customer_id, model, deployment_id, region, hour,
           count(*), count(*) FILTER (WHERE status = 'rejected'),
           sum(input_tokens), sum(cached_input_tokens), sum(output_tokens)
    FROM req WHERE region IS NOT NULL
    GROUP BY customer_id, model, deployment_id, region, hour
    ORDER BY customer_id, model, deployment_id, region, hour
    ON CONFLICT (customer_id, model, deployment_id, region, hour) DO UPDATE SET {_ADD("rg", _REGION_COUNTS)}
), attempts AS (
    INSERT INTO task_attempts AS a (customer_id, task_id, attempt, requests, input_tokens,
                                     cached_input_tokens, output_tokens, first_request_at, last_request_at)
    SELECT customer_id, task_id, attempt, count(*), sum(input_tokens), sum(cached_input_tokens),
           sum(output_tokens), min(occurred_at), max(occurred_at)
    FROM req WHERE task_id IS NOT NULL
    GROUP BY customer_id, task_id, attempt
    ORDER BY customer_id, task_id, attempt
    ON CONFLICT (customer_id, task_id, attempt) DO UPDATE SET
        {_ADD("a", ("requests", "input_tokens", "cached_input_tokens", "output_tokens"))},
        first_request_at = least(a.first_request_at, EXCLUDED.first_request_at),
        last_request_at = greatest(a.last_request_at, EXCLUDED.last_request_at)
), outcomes AS (
    INSERT INTO task_outcomes AS o (customer_id, task_id, outcome, finished_at, source, event_id, failure_cause)
    SELECT DISTINCT ON (customer_id, task_id) customer_id, task_id, outcome, finished_at, source, event_id, failure_cause
    FROM outcome
    ORDER BY customer_id, task_id, finished_at DESC, source DESC, event_id DESC
    ON CONFLICT (customer_id, task_id) DO UPDATE SET
        outcome = EXCLUDED.outcome, finished_at = EXCLUDED.finished_at, failure_cause = EXCLUDED.failure_cause,
        source = EXCLUDED.source, event_id = EXCLUDED.event_id
    WHERE (EXCLUDED.finished_at, EXCLUDED.source, EXCLUDED.event_id) > (o.finished_at, o.source, o.event_id)
), reports AS (
    INSERT INTO task_outcome_reports (customer_id, task_id, source, event_id, outcome, finished_at)
    SELECT customer_id, task_id, source, event_id, outcome, finished_at FROM outcome
    ORDER BY customer_id, task_id, source, event_id
    ON CONFLICT DO NOTHING
), usage AS (
    INSERT INTO usage_rollup_hourly AS u (customer_id, meter, hour, quantity, events)
    SELECT customer_id, meter, hour, sum(quantity), count(*)
    FROM used
    GROUP BY customer_id, meter, hour
    ORDER BY customer_id, meter, hour
    ON CONFLICT (customer_id, meter, hour) DO UPDATE SET {_ADD("u", ("quantity", "events"))}
), task_usage AS (
    INSERT INTO task_usage AS t (customer_id, task_id, meter, quantity)
    SELECT customer_id, task_id, meter, sum(quantity)
    FROM used WHERE task_id IS NOT NULL
    GROUP BY customer_id, task_id, meter
    ORDER BY customer_id, task_id, meter
    ON CONFLICT (customer_id, task_id, meter) DO UPDATE SET quantity = t.quantity + EXCLUDED.quantity
), gpu AS (
    INSERT INTO gpu_ledger_hourly AS g (customer_id, deployment_id, replica_id, gpu_type, hour, {", ".join(_GPU_COUNTS)})
    SELECT g.customer_id, g.deployment_id, g.replica_id, g.gpu_type, g.hour,
           sum(g.gpu_ms), sum(g.busy_ms), sum(g.prompt_tokens), sum(g.generation_tokens), count(*),
           sum(g.wall_ms), sum(g.kv_cache_gpu_ms), sum(g.queue_ms), sum(g.running_ms)
    FROM stage_gpu g JOIN fresh f USING (seq)
    GROUP BY g.customer_id, g.deployment_id, g.replica_id, g.gpu_type, g.hour
    ORDER BY g.customer_id, g.deployment_id, g.replica_id, g.gpu_type, g.hour
    ON CONFLICT (customer_id, deployment_id, replica_id, gpu_type, hour) DO UPDATE SET {_ADD("g", _GPU_COUNTS)}
), scores AS (
    {SCORES_CTE}
{{period_totals}})
SELECT seq FROM fresh
"""

# With the totals, the request events are grouped once per customer x hour x model x deployment x
# project; the hourly rollup and the period totals both add up those groups.
REQUEST_HOURS_CTE = f"""), request_hours AS (
    SELECT customer_id, hour, model, deployment_id, project,
           {REQUEST_SUMS_NAMED}
    FROM req
    GROUP BY customer_id, hour, model, deployment_id, project
"""
_ROLLUP_FROM_EVENTS = f"""SELECT customer_id, model, deployment_id, hour, project,
           {REQUEST_SUMS}
    FROM req
    GROUP BY customer_id, model, deployment_id, hour, project
    ORDER BY customer_id, model, deployment_id, hour, project"""
# the groups are the rollup's rows (both are per customer x hour x model x deployment x project)
_ROLLUP_FROM_HOURS = f"""SELECT customer_id, model, deployment_id, hour, project, {", ".join(_REQUEST_COUNTS)}
    FROM request_hours
    ORDER BY customer_id, model, deployment_id, hour, project"""


def _write_batch(period_totals: bool) -> str:
    parts = {"{request_hours}": REQUEST_HOURS_CTE if period_totals else "",
             "{request_rollup_rows}": _ROLLUP_FROM_HOURS if period_totals else _ROLLUP_FROM_EVENTS,
             "{period_totals}": PERIOD_TOTALS_CTES if period_totals else ""}
    statement = WRITE_BATCH_TEMPLATE
    for placeholder, text in parts.items():
        statement = statement.replace(placeholder, text)
    return statement


WRITE_BATCH = _write_batch(period_totals=True)
# Without the period totals: the write as it was before them (bench.ingest's comparison only).
WRITE_BATCH_WITHOUT_TOTALS = _write_batch(period_totals=False)

# Taken by whoever creates or drops a month's partitions (this writer; metering.archive), for its
# transaction: the archiver's drop and a writer's creation of the same month never interleave.
PARTITIONS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('infermeter.raw_events.partitions'))"


def partition_name(table: str, month: datetime) -> str:
    """`raw_events_YYYY_MM` / `event_keys_YYYY_MM`: the partition of `table` for the UTC month `month`."""
    return f"{table}_{month:%Y_%m}"


LOCK_OFFSETS = """
SELECT partition, next_offset FROM consumer_offsets
WHERE group_id = %s AND topic = %s AND partition = ANY(%s)
FOR UPDATE
"""
INIT_OFFSETS = """
INSERT INTO consumer_offsets (group_id, topic, partition, next_offset)
SELECT %s, %s, p, 0 FROM unnest(%s::int[]) AS p
ON CONFLICT DO NOTHING
"""
SAVE_OFFSET = """
UPDATE consumer_offsets SET next_offset = greatest(next_offset, %s), updated_at = now()
WHERE group_id = %s AND topic = %s AND partition = %s
"""
SAVE_DEAD_LETTER = """
INSERT INTO dead_letters (topic, partition, "offset", reason, detail, event_source, event_id, customer_id, payload)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ON CONSTRAINT dead_letters_position DO NOTHING
"""
SAVE_RECEIPT = """
INSERT INTO ingest_receipts AS r (ingest_id, accepted, duplicates, rejected)
VALUES (%s, %s, %s, %s)
ON CONFLICT (ingest_id) DO UPDATE SET
    accepted = r.accepted + EXCLUDED.accepted, duplicates = r.duplicates + EXCLUDED.duplicates,
    rejected = r.rejected + EXCLUDED.rejected, updated_at = now()
"""


@dataclass
class Prepared:
    """A batch decoded ahead of its transaction."""

    messages: list[Message]
    batch: ProcessedBatch


@dataclass
class WriteResult:
    written: int = 0  # messages handled (not fenced off)
    accepted: int = 0  # fresh events stored
    duplicates: int = 0
    rejected: int = 0
    skipped: int = 0  # messages below the stored offset: written before

    def merge(self, other: WriteResult) -> None:
        for name in ("written", "accepted", "duplicates", "rejected", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class BatchWriter:
    """Owns one Postgres connection; `write(messages)` commits one batch or raises."""

    def __init__(self, dsn: str, *, group_id: str, max_bytes: int, future_tolerance_s: int, clock=None,
                 retention_months: int | None = None, retention_clock=None, period_totals: bool = True):
        """`clock` is the now events are judged against (the future tolerance; the retention too unless
        `retention_clock` is given: the now the retention's oldest month is counted back from)."""
        self.dsn = dsn
        # False only to measure what the totals cost (bench.ingest): the totals are then left behind.
        self.period_totals = period_totals
        self.group_id = group_id
        self.max_bytes = max_bytes
        self.future_tolerance_s = future_tolerance_s
        self.retention_months = retention_months  # None: events of any age (metering.processor.process)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.retention_clock = retention_clock or self.clock
        self._conn: psycopg.Connection | None = None
        self._partitions: set[datetime] = set()

    # --- connection ---------------------------------------------------------------------------
    def connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.dsn, autocommit=False, connect_timeout=10)
            with self._conn.cursor() as cur:
                cur.execute("SET TIME ZONE 'UTC'")
                cur.execute(CREATE_STAGE)
            self._conn.commit()
            self._partitions.clear()
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    # --- offsets --------------------------------------------------------------------------------
    def stored_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Where each partition resumes. Its own short connection: rebalance callbacks run on the
        polling thread while the write thread may be mid-transaction."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        found: dict[TopicPartition, int] = {}
        with psycopg.connect(self.dsn, connect_timeout=10) as conn:
            for topic, parts in by_topic.items():
                rows = conn.execute(
                    "SELECT partition, next_offset FROM consumer_offsets "
                    "WHERE group_id = %s AND topic = %s AND partition = ANY(%s)",
                    (self.group_id, topic, parts),
                ).fetchall()
                for partition, offset in rows:
                    found[TopicPartition(topic, partition)] = offset
        return found

    # --- monthly partitions of raw_events and event_keys ------------------------------------------
    def ensure_partitions(self, months: set[datetime]) -> None:
        """Create the month's raw_events and event_keys partitions (the latter keyed by (source,
        event_id): the dedup arbiter), except for a month already archived: its events are older
        than the retention, and its keys are gone, so it is never filled again (an event of it that
        reached here anyway, from a writer whose clock lags the archiver's, is refused by Postgres
        and dead-lettered as `storage_error`)."""
        missing = months - self._partitions
        if not missing:
            return
        conn = self.connection()
        with conn.cursor() as cur:
            cur.execute(PARTITIONS_LOCK)
            cur.execute("SELECT month FROM archived_months WHERE month = ANY(%s)", (sorted(missing),))
            archived = {row[0] for row in cur.fetchall()}
            for month in sorted(missing - archived):
                # event_keys before raw_events: the order in which a batch's statement locks them. A
                # partition's creation locks its parent exclusive until this commit; in the other
                # order, a writer whose statement holds event_keys and waits for raw_events deadlocks
                # with this transaction (two writers, one of them the first to meet a new month).
                bounds = f"FOR VALUES FROM ('{month.isoformat()}') TO ('{next_month(month).isoformat()}')"
                cur.execute(f"CREATE TABLE IF NOT EXISTS {partition_name('event_keys', month)} "
                            f"PARTITION OF event_keys (PRIMARY KEY (source, event_id)) {bounds}")
                cur.execute(f"CREATE TABLE IF NOT EXISTS {partition_name('raw_events', month)} "
                            f"PARTITION OF raw_events {bounds}")
        conn.commit()
        self._partitions |= missing - archived

    # --- the batch -----------------------------------------------------------------------------
    def prepare(self, messages: Sequence[Message]) -> Prepared:
        """Decode and validate a batch (pure, no database): may run ahead of the write."""
        batch = process(messages, now=self.clock(), max_bytes=self.max_bytes, future_tolerance_s=self.future_tolerance_s,
                        retention_months=self.retention_months,
                        retention_now=self.retention_clock() if self.retention_months is not None else None)
        return Prepared(list(messages), batch)

    def write(self, messages: Sequence[Message] | Prepared) -> WriteResult:
        """Write one batch in one transaction (or raise, leaving nothing behind)."""
        prepared = messages if isinstance(messages, Prepared) else self.prepare(messages)
        if not prepared.messages:
            return WriteResult()
        conn = self.connection()
        try:
            return self._write(conn, prepared)
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise

    def _write(self, conn: psycopg.Connection, prepared: Prepared) -> WriteResult:
        result = WriteResult()
        messages = prepared.messages
        ends: dict[TopicPartition, int] = {}
        for m in messages:
            tp = TopicPartition(m.topic, m.partition)
            ends[tp] = max(ends.get(tp, 0), m.offset + 1)
        months = {month_start(row[5]) for row in prepared.batch.stage_rows}
        if months - self._partitions:
            self.ensure_partitions(months)  # DDL in its own short transaction
        with conn.cursor() as cur:
            stored = self._fence(cur, ends)
            todo = [m for m in messages if m.offset >= stored.get(TopicPartition(m.topic, m.partition), 0)]
            result.skipped = len(messages) - len(todo)
            # Rare (a replay after a crash or rebalance): decode again without what was written.
            batch = prepared.batch if not result.skipped else self.prepare(todo).batch
            fresh = self._stage_and_merge(cur, batch)
            self._dead_letters(cur, batch)
            self._receipts(cur, batch, fresh, result)
            for tp, end in ends.items():
                cur.execute(SAVE_OFFSET, (end, self.group_id, tp.topic, tp.partition))
        conn.commit()
        result.written = len(todo)
        return result

    def write_refused(self, message: Message, error: BaseException | None) -> WriteResult:
        """Dead-letter one event Postgres refused to store (reason `storage_error`), with its offset."""
        conn = self.connection()
        tp = TopicPartition(message.topic, message.partition)
        try:
            with conn.cursor() as cur:
                stored = self._fence(cur, {tp: message.offset + 1})
                if message.offset < stored.get(tp, 0):
                    conn.rollback()
                    return WriteResult(skipped=1)
                detail = str(error).strip().splitlines()[0] if error else "refused by the database"
                ingest_id = message.headers.get(INGEST_ID_HEADER)
                cur.execute(SAVE_DEAD_LETTER, (message.topic, message.partition, message.offset, "storage_error",
                                               detail, None, None, None, message.value or b""))
                if ingest_id is not None:
                    cur.execute(SAVE_RECEIPT, (ingest_id.decode("utf-8", "replace"), 0, 0, 1))
                cur.execute(SAVE_OFFSET, (message.offset + 1, self.group_id, tp.topic, tp.partition))
            conn.commit()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        return WriteResult(written=1, rejected=1)

    def _fence(self, cur: psycopg.Cursor, ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        stored: dict[TopicPartition, int] = {}
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in ends:
            by_topic[tp.topic].append(tp.partition)
        for topic, parts in by_topic.items():
            parts.sort()
            cur.execute(INIT_OFFSETS, (self.group_id, topic, parts))
            cur.execute(LOCK_OFFSETS, (self.group_id, topic, parts))
            for partition, offset in cur.fetchall():
                stored[TopicPartition(topic, partition)] = offset
        return stored

    def _stage_and_merge(self, cur: psycopg.Cursor, batch: ProcessedBatch) -> list[int]:
        if not batch.stage_rows:
            return []
        with cur.copy(f"COPY stage ({', '.join(STAGE_COLUMNS)}) FROM STDIN") as copy:
            for row in batch.stage_rows:
                copy.write_row(row)
        if batch.gpu_rows:
            with cur.copy(f"COPY stage_gpu ({', '.join(GPU_STAGE_COLUMNS)}) FROM STDIN") as copy:
                for row in batch.gpu_rows:
                    copy.write_row(row)
        if not self.period_totals:
            cur.execute(WRITE_BATCH_WITHOUT_TOTALS)
            return [row[0] for row in cur.fetchall()]
        cur.execute(LOCK_CALENDARS_SHARED)  # before the statement: its snapshot sees the committed calendars
        if batch.names_tasks:
            cur.execute(LOCK_TASK_CUSTOMERS, (sorted({row[4] for row in batch.stage_rows if row[7] is not None}),))
        cur.execute(WRITE_BATCH)
        fresh = [row[0] for row in cur.fetchall()]
        if batch.names_tasks:
            move_tasks(cur, BATCH_TASK_CHANGES)  # sees the outcomes and attempts the statement just wrote
        return fresh

    def _dead_letters(self, cur: psycopg.Cursor, batch: ProcessedBatch) -> None:
        if batch.dead_letters:
            cur.executemany(
                SAVE_DEAD_LETTER,
                [
                    (d.topic, d.partition, d.offset, d.reason, d.detail, d.event_source, d.event_id,
                     d.customer_id, d.payload)
                    for d in batch.dead_letters
                ],
            )

    def _receipts(self, cur: psycopg.Cursor, batch: ProcessedBatch, fresh: list[int], result: WriteResult) -> None:
        accepted = Counter(batch.ingest_ids[seq] for seq in fresh)
        staged = Counter(batch.ingest_ids)
        rejected = Counter(d.ingest_id for d in batch.dead_letters)
        result.accepted = len(fresh)
        result.rejected = len(batch.dead_letters)
        result.duplicates = batch.staged - len(fresh) + sum(batch.batch_duplicates.values())
        rows = []
        for ingest_id in set(staged) | set(rejected) | set(batch.batch_duplicates):
            if ingest_id is None:
                continue
            duplicates = staged[ingest_id] - accepted[ingest_id] + batch.batch_duplicates[ingest_id]
            rows.append((ingest_id, accepted[ingest_id], duplicates, rejected[ingest_id]))
        if rows:
            cur.executemany(SAVE_RECEIPT, sorted(rows))  # one lock order for concurrent writers
