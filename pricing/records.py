"""The raw aggregates pricing works from, as plain values (the adapters fill them from the metering
rollups; tests build them by hand). One record per rollup row; hours are the start of [hour, hour+1h).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal


@dataclass(frozen=True)
class RequestRecord:
    """One request_rollup_hourly row: a customer's requests to a model on a deployment in an hour."""

    customer_id: str
    model: str
    deployment_id: str
    hour: datetime
    requests: int
    input_tokens: int  # all prompt tokens, cached included
    cached_input_tokens: int
    output_tokens: int

    @property
    def uncached_input_tokens(self) -> int:
        return self.input_tokens - self.cached_input_tokens


@dataclass(frozen=True)
class GpuRecord:
    """One gpu_ledger_hourly row summed over replicas: a deployment's GPU time in an hour.
    customer_id '' is the shared pool; a set customer_id means a deployment dedicated to it."""

    customer_id: str
    deployment_id: str
    gpu_type: str
    hour: datetime
    gpu_ms: int

    @property
    def gpu_seconds(self) -> Decimal:
        return Decimal(self.gpu_ms) / 1000  # exact: ms have three decimal places


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    requests: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TaskRecord:
    """A task whose outcome was recorded, with every attempt it made and its tool/verification usage."""

    customer_id: str
    task_id: str
    outcome: str  # succeeded | failed | abandoned
    finished_at: datetime
    attempts: tuple[AttemptRecord, ...] = ()
    usage: Mapping[str, Decimal] = field(default_factory=dict)  # task_usage: meter -> quantity

    @property
    def last_attempt(self) -> int:
        return max((a.attempt for a in self.attempts), default=0)


@dataclass(frozen=True)
class MeterRecord:
    """One usage_rollup_hourly row (an infermeter.usage.v1 meter)."""

    customer_id: str
    meter: str
    hour: datetime
    quantity: Decimal


@dataclass(frozen=True)
class Dataset:
    """Everything metered in [start, end): what rating, the cost model and experiments read."""

    start: datetime
    end: datetime
    requests: tuple[RequestRecord, ...] = ()
    gpu: tuple[GpuRecord, ...] = ()
    tasks: tuple[TaskRecord, ...] = ()
    meters: tuple[MeterRecord, ...] = ()

    def customers(self) -> list[str]:
        ids = {r.customer_id for r in self.requests} | {t.customer_id for t in self.tasks}
        ids |= {m.customer_id for m in self.meters} | {g.customer_id for g in self.gpu if g.customer_id}
        return sorted(ids)
