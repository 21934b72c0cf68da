"""Decode a batch of Kafka messages into rows to stage (pure: no I/O).

A processor is a function from messages to rows: the same messages give the same rows, so that
processing a message twice cannot change what metering stores (the writer's unique keys and
offset fence do the rest). Invalid messages become dead letters with their reason; the rest of
the batch is unaffected.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from infermeter.times import add_months, month_start, utc_text
from metering.contract import (
    REPLICA_V1,
    REQUEST_V1,
    TASK_V1,
    Event,
    InvalidEvent,
    ReplicaData,
    decode_event,
)
from metering.kafka_types import Message

INGEST_ID_HEADER = "infermeter-ingest-id"
HOUR = timedelta(hours=1)
_MS = Decimal(1000)

# Column order of the staging table (metering.writer.STAGE_COLUMNS must match).
StageRow = tuple


@dataclass(frozen=True, slots=True)
class DeadLetter:
    topic: str | None
    partition: int | None
    offset: int | None
    reason: str
    detail: str
    event_source: str | None
    event_id: str | None
    customer_id: str | None
    payload: bytes
    ingest_id: str | None = None


@dataclass(frozen=True, slots=True)
class GpuSlice:
    """The part of one replica interval that falls in one hour."""

    customer_id: str  # '' for the shared pool
    deployment_id: str
    replica_id: str
    gpu_type: str
    hour: datetime
    gpu_ms: int
    busy_ms: int
    prompt_tokens: int
    generation_tokens: int
    wall_ms: int = 0
    kv_cache_gpu_ms: int = 0  # gpu_ms x the interval's mean KV-cache usage
    queue_ms: int = 0  # request-ms waiting: time-averaged queue x wall ms
    running_ms: int = 0  # request-ms running


@dataclass
class ProcessedBatch:
    stage_rows: list[StageRow] = field(default_factory=list)
    gpu_rows: list[tuple] = field(default_factory=list)  # (seq, *GpuSlice fields)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    ingest_ids: list[str | None] = field(default_factory=list)  # per seq
    batch_duplicates: Counter = field(default_factory=Counter)  # ingest id -> repeats inside this batch
    names_tasks: bool = False  # some request or task event names a task (its period totals may move)

    @property
    def staged(self) -> int:
        return len(self.stage_rows)


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _split_exact(total: int, weights: list[int]) -> list[int]:
    """Split an integer in proportion to weights, summing exactly (largest remainder)."""
    whole = sum(weights)
    if whole == 0:
        return [total] + [0] * (len(weights) - 1)
    shares = [total * w // whole for w in weights]
    remainders = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in remainders[: total - sum(shares)]:
        shares[i] += 1
    return shares


def _scaled_ms(total_ms: int, factor: str | None) -> int:
    """round(total_ms x factor) half-up; 0 when the factor was not reported."""
    if factor is None:
        return 0
    return int((total_ms * Decimal(factor)).to_integral_value(ROUND_HALF_UP))


def split_interval(data: ReplicaData) -> list[GpuSlice]:
    """Split a replica interval at hour boundaries. gpu_ms = slice milliseconds x gpu_count;
    busy time and engine token counters are shared out in proportion to slice length, exactly; so is
    the engine state: KV-cache memory-time (interval gpu_ms x kv_cache_usage) and the request-ms
    waiting and running (interval ms x the time-averaged requests_waiting / requests_running)."""
    start = data.interval_start.astimezone(UTC)
    end = data.interval_end.astimezone(UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    to_ms = lambda t: (t - epoch) // timedelta(milliseconds=1)  # noqa: E731 - floor, so slices add up
    bounds = [start]
    cursor = hour_of(start) + HOUR
    while cursor < end:
        bounds.append(cursor)
        cursor += HOUR
    bounds.append(end)
    slice_ms = [to_ms(b) - to_ms(a) for a, b in zip(bounds, bounds[1:], strict=False)]
    busy_total = int((Decimal(data.busy_seconds) * _MS).to_integral_value(ROUND_HALF_UP))
    busy = _split_exact(busy_total, slice_ms)
    prompt = _split_exact(data.prompt_tokens, slice_ms)
    generation = _split_exact(data.generation_tokens, slice_ms)
    interval_ms = sum(slice_ms)
    kv = _split_exact(_scaled_ms(interval_ms * data.gpu_count, data.kv_cache_usage), slice_ms)
    queue = _split_exact(_scaled_ms(interval_ms, data.requests_waiting), slice_ms)
    running = _split_exact(_scaled_ms(interval_ms, data.requests_running), slice_ms)
    return [
        GpuSlice(
            customer_id=data.customer_id or "",
            deployment_id=data.deployment_id,
            replica_id=data.replica_id,
            gpu_type=data.gpu_type,
            hour=hour_of(bounds[i]),
            gpu_ms=slice_ms[i] * data.gpu_count,
            busy_ms=busy[i],
            prompt_tokens=prompt[i],
            generation_tokens=generation[i],
            wall_ms=slice_ms[i],
            kv_cache_gpu_ms=kv[i],
            queue_ms=queue[i],
            running_ms=running[i],
        )
        for i in range(len(slice_ms))
    ]


def stage_row(seq: int, event: Event, payload: bytes) -> StageRow:
    """One staging row: the envelope columns and the event as received (Postgres reads the
    per-type fields from the payload, in C, once per batch), and the task a request or task event
    names (the tasks whose period totals the writer looks at again)."""
    task_id = event.data.task_id if event.type in (REQUEST_V1, TASK_V1) else None
    return (seq, event.source, event.id, event.type, event.subject, event.time, payload.decode("utf-8"), task_id)


def oldest_retained_month(now: datetime, retention_months: int) -> datetime:
    """The first instant of the oldest UTC month metering keeps (INFERMETER_RETENTION_MONTHS): the
    retained window is the month of `now` and the `retention_months - 1` months before it."""
    if retention_months < 1:
        raise ValueError(f"the retention must be at least 1 month, not {retention_months}")
    return add_months(month_start(now), -(retention_months - 1))


def check_retained(event: Event, oldest_month: datetime, retention_months: int) -> None:
    """Refuse an event older than the retention (reason `too_old`): its month's keys may be archived
    already, so whether it is a duplicate could not be told, and its partitions may be gone."""
    if event.time < oldest_month:
        raise InvalidEvent(
            "too_old",
            f"time {utc_text(event.time)} is before {oldest_month:%Y-%m}, the oldest month metering keeps "
            f"(INFERMETER_RETENTION_MONTHS={retention_months}): older months are archived, so a duplicate "
            "could no longer be recognised",
            source=event.source, event_id=event.id, customer_id=event.subject,
        )


def process(messages: Iterable[Message], *, now: datetime, max_bytes: int, future_tolerance_s: int,
            retention_months: int | None = None, retention_now: datetime | None = None) -> ProcessedBatch:
    """Decode a batch. `retention_months` (None: no limit) dead-letters events older than the
    retention as `too_old`, like the future tolerance does events too far ahead. The retention is
    judged from `retention_now` (default `now`, which the future tolerance is judged from)."""
    batch = ProcessedBatch()
    seen: set[tuple[str, str]] = set()
    oldest = (oldest_retained_month(now if retention_now is None else retention_now, retention_months)
              if retention_months is not None else None)
    for message in messages:
        ingest_id = message.headers.get(INGEST_ID_HEADER)
        ingest_id = ingest_id.decode("utf-8", "replace") if ingest_id is not None else None
        payload = message.value or b""
        try:
            event = decode_event(payload, now=now, max_bytes=max_bytes, future_tolerance_s=future_tolerance_s)
            if oldest is not None:
                check_retained(event, oldest, retention_months)
        except InvalidEvent as exc:
            batch.dead_letters.append(
                DeadLetter(
                    message.topic, message.partition, message.offset, exc.reason, exc.detail,
                    exc.source, exc.event_id, exc.customer_id, payload, ingest_id,
                )
            )
            continue
        key = (event.source, event.id)
        if key in seen:
            batch.batch_duplicates[ingest_id] += 1
            continue
        seen.add(key)
        seq = len(batch.stage_rows)
        row = stage_row(seq, event, payload)
        batch.stage_rows.append(row)
        batch.names_tasks = batch.names_tasks or row[7] is not None
        batch.ingest_ids.append(ingest_id)
        if event.type == REPLICA_V1:
            for piece in split_interval(event.data):
                batch.gpu_rows.append(
                    (seq, piece.customer_id, piece.deployment_id, piece.replica_id, piece.gpu_type, piece.hour,
                     piece.gpu_ms, piece.busy_ms, piece.prompt_tokens, piece.generation_tokens,
                     piece.wall_ms, piece.kv_cache_gpu_ms, piece.queue_ms, piece.running_ms)
                )
    return batch


__all__ = ["process", "oldest_retained_month", "check_retained", "split_interval", "DeadLetter", "ProcessedBatch", "GpuSlice", "INGEST_ID_HEADER"]
