"""The test oracle for the usage experiments rate: each customer's usage of a period attributed in
Python from the hourly records (`pricing.records.Dataset` + `pricing.cost.attribute`).

Production loads usage one way, the way invoices do (`pricing_service.rate_period.load_period_usages`:
SQL sums and SQL GPU attribution). This independent Python version was the experiments' own path
before; it stays here to check that one on real data (tests/pricing_service/test_rate_period.py) and
to feed the pure experiment tests (`oracle_usages`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from pricing.cost import Attribution, CostModel, attribute
from pricing.experiments import ExperimentUsages, experiment_buckets
from pricing.meters import REQUEST_METERS
from pricing.money import precise
from pricing.records import Dataset
from pricing.usage import Usage, UsageKey

ZERO = Decimal(0)


def customer_usages(
    dataset: Dataset,
    attribution: Attribution,
    start: datetime,
    end: datetime,
    *,
    caching_off_for: Iterable[str] = (),
) -> dict[str, Usage]:
    """Each customer's usage of [start, end): request meters by hour of event time, GPU-seconds of
    their dedicated deployments plus their attributed share of the shared pool, tasks by the time of
    their outcome, usage meters by hour."""
    off = frozenset(caching_off_for)
    out: dict[str, dict[UsageKey, Decimal | int]] = {}
    keys: dict[tuple[str, str], tuple[UsageKey, UsageKey, UsageKey, UsageKey]] = {}

    def add(customer: str, key: UsageKey, quantity: Decimal | int) -> None:
        quantities = out.get(customer)
        if quantities is None:
            quantities = out[customer] = {}
        quantities[key] = quantities.get(key, 0) + quantity

    for r in dataset.requests:
        if not (start <= r.hour < end):
            continue
        k = keys.get((r.model, r.deployment_id))
        if k is None:
            k = keys[(r.model, r.deployment_id)] = tuple(
                UsageKey(m, r.model, r.deployment_id) for m in REQUEST_METERS
            )
        cached = 0 if r.model in off else r.cached_input_tokens
        quantities = out.get(r.customer_id)
        if quantities is None:
            quantities = out[r.customer_id] = {}
        for key, q in ((k[0], r.input_tokens - cached), (k[1], cached), (k[2], r.output_tokens), (k[3], r.requests)):
            quantities[key] = quantities.get(key, 0) + q
    gpu: dict[str, dict[UsageKey, Decimal]] = {}
    for k, seconds in attribution.gpu_seconds.items():
        if k.customer_id and start <= k.hour < end:
            key = UsageKey("gpu_seconds", "", k.deployment_id, k.gpu_type)
            per = gpu.setdefault(k.customer_id, {})
            per[key] = per.get(key, ZERO) + seconds
    for customer, per in gpu.items():
        for key, seconds in per.items():
            # attributed GPU-seconds are exact fractions: keep them at the project scale (12 places)
            add(customer, key, precise(seconds))
    for t in dataset.tasks:
        if not (start <= t.finished_at < end):
            continue
        if t.outcome == "succeeded":
            add(t.customer_id, UsageKey("successful_tasks"), 1)
        elif t.outcome == "failed":
            add(t.customer_id, UsageKey("failed_tasks"), 1)
        add(t.customer_id, UsageKey("task_attempts"), len(t.attempts))
    for m in dataset.meters:
        if start <= m.hour < end:
            add(m.customer_id, UsageKey("usage:" + m.meter), m.quantity)
    # zero quantities dropped as Usage.build does; every quantity here is a non-negative int or Decimal
    return {c: Usage.trusted(c, start, end, {k: v for k, v in q.items() if v}) for c, q in out.items()}


def bucket_usages(
    dataset: Dataset, attribution: Attribution, bounds: list[tuple[datetime, datetime]]
) -> list[dict[str, Usage]]:
    """customer_usages of each bucket, splitting the records once (not once per bucket)."""
    starts = [a for a, _ in bounds]

    def index(t: datetime) -> int | None:
        i = bisect_right(starts, t) - 1
        return i if 0 <= i and t < bounds[i][1] else None

    parts: list[tuple[list, list, list]] = [([], [], []) for _ in bounds]
    gpu_parts: list[dict] = [{} for _ in bounds]
    for r in dataset.requests:
        if (i := index(r.hour)) is not None:
            parts[i][0].append(r)
    for t in dataset.tasks:
        if (i := index(t.finished_at)) is not None:
            parts[i][1].append(t)
    for m in dataset.meters:
        if (i := index(m.hour)) is not None:
            parts[i][2].append(m)
    for k, seconds in attribution.gpu_seconds.items():
        if (i := index(k.hour)) is not None:
            gpu_parts[i][k] = seconds
    return [
        customer_usages(Dataset(a, b, tuple(req), (), tuple(tasks), tuple(meters)), Attribution(gpu_seconds=gpu), a, b)
        for (a, b), (req, tasks, meters), gpu in zip(bounds, parts, gpu_parts, strict=True)
    ]


def oracle_usages(dataset: Dataset, cost_model: CostModel) -> ExperimentUsages:
    """What `pricing.experiments.compare` rates, attributed in Python: the window, its buckets and
    the window with caching off for each model."""
    start, end = dataset.start, dataset.end
    attribution = attribute(dataset, cost_model)
    _, bounds = experiment_buckets(start, end)
    caching_off = {}
    for m in sorted({r.model for r in dataset.requests}):
        off = attribute(dataset, cost_model, caching_off_for=[m])
        caching_off[m] = customer_usages(dataset, off, start, end, caching_off_for=[m])
    return ExperimentUsages(
        customer_usages(dataset, attribution, start, end), bucket_usages(dataset, attribution, bounds), caching_off
    )
