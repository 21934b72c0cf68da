"""The cost model: what serving the usage cost the platform, attributed down to customer, model,
request and task. Pure; docs/cost-model.md explains the method with a worked example.

1. Each deployment-hour's GPU time (gpu_ms summed over its replicas, / 1000 = GPU-seconds, exact)
   costs GPU-seconds x the configured $/GPU-hour of its gpu_type / 3600.
2. That time is attributed to the (customer, model) pairs served on the deployment in that hour in
   proportion to the weighted tokens they made the engine process:
   prefill_weight x uncached input tokens + decode_weight x output tokens.
   Shared-pool deployments (customer_id '') and dedicated ones are attributed the same way; an hour
   with GPU time but no tokens is idle: a dedicated deployment's idle time is its customer's, the
   shared pool's idle time stays with the platform (customer '').
3. Task attempts carry tokens but no deployment: an attempt costs its weighted tokens x its
   customer's average cost per weighted token in the window (the platform's average if the customer
   has none). Cost per successful task = (cost of every attempt of the tasks + their tool and
   verification usage at the configured unit cost) / successful tasks.
4. "As if prefix caching were off": a model's cached input tokens become uncached; each
   deployment-hour's GPU time grows by the ratio of its new weighted tokens to its old ones (the same
   GPU-seconds per weighted token), and is attributed by the new weights.
5. Allocations add up: every proportional split is made on a fixed quantum (10^-12 GPU-s; a cent for
   money) by largest remainder (`largest_remainder`), so the parts sum exactly to the whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pricing.book import Amount, QuantityValue, _ExactLoader, _path, _reason
from pricing.money import EXACT, QUANT, SCALE, Currency, exact_sum
from pricing.records import Dataset, TaskRecord

ZERO = Decimal(0)
POOL = ""  # customer id of the shared pool


class CostModelError(ValueError):
    pass


class CostModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = "USD"
    gpu_hour: dict[str, Amount] = Field(description="cost of one GPU-hour per gpu_type")
    prefill_weight: QuantityValue = Field(default=Decimal(1), ge=0)
    decode_weight: QuantityValue = Field(default=Decimal(1), ge=0)
    usage_unit_cost: dict[str, Amount] = Field(default_factory=dict, description="cost per unit of a usage meter")
    kv_cache_share: QuantityValue = Field(
        default=Decimal("0.3"), ge=0, le=1,
        description="share of a GPU's cost that pays for the memory a full KV cache holds (cost anatomy)",
    )

    @field_validator("currency")
    @classmethod
    def _currency(cls, code: str) -> str:
        Currency.of(code)
        return code

    def gpu_hour_cost(self, gpu_type: str) -> Decimal:
        try:
            return self.gpu_hour[gpu_type]
        except KeyError:
            raise CostModelError(
                f"no $/GPU-hour configured for gpu_type {gpu_type!r} (cost model has: {', '.join(sorted(self.gpu_hour))})"
            ) from None

    def weight(self, uncached_input_tokens: int | Decimal, output_tokens: int | Decimal) -> Decimal:
        return self.prefill_weight * uncached_input_tokens + self.decode_weight * output_tokens

    def usage_cost(self, meter: str, quantity: Decimal) -> Decimal:
        return self.usage_unit_cost.get(meter, ZERO) * quantity


def parse_cost_model(text: str, source: str = "<cost model>") -> CostModel:
    try:
        data = yaml.load(text, Loader=_ExactLoader)  # noqa: S506
        return CostModel.model_validate(data or {})
    except yaml.YAMLError as exc:
        raise CostModelError(f"{source}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise CostModelError(
            "\n".join(f"{source}: {_path(tuple(e['loc'])) or '(top level)'}: {_reason(e)}" for e in exc.errors())
        ) from None


@dataclass(frozen=True)
class CostKey:
    customer_id: str  # '' = the shared pool's idle time
    model: str  # '' = idle time
    deployment_id: str
    gpu_type: str
    hour: datetime


@dataclass
class Attribution:
    """GPU-seconds and their cost, attributed to customer x model x deployment x gpu_type x hour."""

    gpu_seconds: dict[CostKey, Decimal] = field(default_factory=dict)
    cost: dict[CostKey, Decimal] = field(default_factory=dict)
    weighted_tokens: dict[tuple[str, str], Decimal] = field(default_factory=dict)  # (customer, model)
    requests: dict[tuple[str, str], int] = field(default_factory=dict)

    def cost_by(self, *, customer: str | None = None, model: str | None = None,
                start: datetime | None = None, end: datetime | None = None) -> Decimal:
        return exact_sum(
            v for k, v in self.cost.items()
            if (customer is None or k.customer_id == customer)
            and (model is None or k.model == model)
            and (start is None or k.hour >= start)
            and (end is None or k.hour < end)
        )

    @property
    def total_cost(self) -> Decimal:
        return exact_sum(self.cost.values())

    def cost_per_weighted_token(self, customer: str | None = None) -> Decimal:
        keys = [k for k in self.weighted_tokens if customer is None or k[0] == customer]
        weight = exact_sum(self.weighted_tokens[k] for k in keys)
        if not weight:
            return ZERO if customer is None else self.cost_per_weighted_token(None)
        served = exact_sum(v for k, v in self.cost.items() if k.model and (customer is None or k.customer_id == customer))
        with localcontext(EXACT):
            return served / weight

    def cost_per_weighted_token_by_customer(self) -> dict[str, Decimal]:
        """Every customer's served cost / weighted tokens, in one pass (customers without tokens left out)."""
        weight: dict[str, Decimal] = defaultdict(lambda: ZERO)
        served: dict[str, Decimal] = defaultdict(lambda: ZERO)
        for (customer, _), w in self.weighted_tokens.items():
            weight[customer] = EXACT.add(weight[customer], w)
        for k, v in self.cost.items():
            if k.model:
                served[k.customer_id] = EXACT.add(served[k.customer_id], v)
        with localcontext(EXACT):
            return {c: served[c] / w for c, w in weight.items() if w}

    def cost_per_request(self, customer: str, model: str) -> Decimal:
        n = self.requests.get((customer, model), 0)
        with localcontext(EXACT):
            return self.cost_by(customer=customer, model=model) / n if n else ZERO


def attribute(dataset: Dataset, model: CostModel, *, caching_off_for: Iterable[str] = ()) -> Attribution:
    """Attribute every deployment-hour's GPU time (and cost) to what it served; see the module doc.
    Each deployment-hour's GPU-seconds are split with `split_gpu_seconds` (largest remainder on the
    quantum GPU_SECONDS_QUANTUM): the shares add up to the hour's GPU-seconds exactly."""
    off = frozenset(caching_off_for)
    served: dict[tuple[str, datetime], dict[tuple[str, str], list[Decimal]]] = defaultdict(dict)
    out = Attribution()
    pw, dw = model.prefill_weight, model.decode_weight
    for r in dataset.requests:
        key = (r.customer_id, r.model)
        slot = served[(r.deployment_id, r.hour)].setdefault(key, [ZERO, ZERO])
        actual = pw * (r.input_tokens - r.cached_input_tokens) + dw * r.output_tokens
        scenario = pw * r.input_tokens + dw * r.output_tokens if r.model in off else actual
        slot[0] += actual
        slot[1] += scenario
        out.weighted_tokens[key] = out.weighted_tokens.get(key, ZERO) + scenario
        out.requests[key] = out.requests.get(key, 0) + r.requests
    gpu: dict[tuple[str, datetime], dict[tuple[str, str], int]] = defaultdict(dict)
    for g in dataset.gpu:
        slots = gpu[(g.deployment_id, g.hour)]
        k = (g.customer_id, g.gpu_type)
        slots[k] = slots.get(k, 0) + g.gpu_ms
    with localcontext(EXACT):
        for (deployment, hour), by_owner in gpu.items():
            shares = served.get((deployment, hour), {})
            actual = sum((w[0] for w in shares.values()), ZERO)
            for (owner, gpu_type), ms in by_owner.items():
                rate = model.gpu_hour_cost(gpu_type) / 3600
                if not actual:
                    k = CostKey(owner, "", deployment, gpu_type, hour)  # idle: the owner's, or the pool's
                    seconds = Decimal(ms) / 1000
                    out.gpu_seconds[k] = out.gpu_seconds.get(k, ZERO) + seconds
                    out.cost[k] = out.cost.get(k, ZERO) + seconds * rate
                    continue
                keys = sorted(k for k, w in shares.items() if w[1])
                parts = split_gpu_seconds(ms, actual, [shares[k][1] for k in keys])
                for (customer, m), part in zip(keys, parts, strict=True):
                    k = CostKey(customer, m, deployment, gpu_type, hour)
                    out.gpu_seconds[k] = out.gpu_seconds.get(k, ZERO) + part
                    out.cost[k] = out.cost.get(k, ZERO) + part * rate
    return out


# ---------------------------------------------------------------- allocations that add up

# GPU-seconds are split on this quantum (the project scale, 10^-12 s): a deployment-hour's GPU-ms are
# 10^9 quanta each, so whole hours of whole GPU-seconds stay whole.
GPU_SECONDS_QUANTUM = QUANT
_QUANTA_PER_MS = 10**9


def _integer_weights(weights: Sequence[Decimal | int]) -> list[int]:
    """The same proportions as integers (every weight scaled by one power of ten)."""
    places = 0
    for w in weights:
        exponent = Decimal(w).as_tuple().exponent
        if isinstance(exponent, int) and -exponent > places:
            places = -exponent
    return [int(Decimal(w).scaleb(places)) for w in weights]


def largest_remainder(whole: int, weights: Sequence[Decimal | int]) -> list[int]:
    """Split the integer `whole` (quanta) in proportion to non-negative `weights`: each part is the floor
    of its exact share, and the quanta left over go one each to the largest remainders (ties: the
    earlier weight first). The parts always sum to `whole`; all weights zero: all of it to the first."""
    if not weights:
        if whole:
            raise ValueError("nothing to split a non-zero whole among")
        return []
    ints = _integer_weights(weights)
    if any(w < 0 for w in ints):
        raise ValueError("weights must be non-negative")
    total = sum(ints)
    if not total:
        return [whole] + [0] * (len(ints) - 1)
    floors = []
    remainders = []
    for w in ints:
        q, r = divmod(whole * w, total)
        floors.append(q)
        remainders.append(r)
    left = whole - sum(floors)
    for i in sorted(range(len(ints)), key=lambda i: (-remainders[i], i))[:left]:
        floors[i] += 1
    return floors


def split_gpu_seconds(gpu_ms: int, actual_weight: Decimal, weights: Sequence[Decimal]) -> list[Decimal]:
    """A deployment-hour's GPU-seconds shared in proportion to `weights`, on the quantum
    GPU_SECONDS_QUANTUM by largest remainder. The whole is `gpu_ms` grown by sum(weights) /
    actual_weight (they are equal unless prefix caching is switched off in an experiment; the grown
    whole is rounded half-up to the quantum). The SQL path (pricing_service.rate_period) reads the same
    weights and calls this, so both give the same shares."""
    ints = _integer_weights([actual_weight, *weights])
    actual, scenario = ints[0], sum(ints[1:])
    if not actual:
        raise ValueError("no weight served: the hour is idle")
    whole_num, whole_den = gpu_ms * _QUANTA_PER_MS * scenario, actual
    whole = (2 * whole_num + whole_den) // (2 * whole_den)  # half-up
    return [Decimal(q).scaleb(-SCALE) for q in largest_remainder(whole, ints[1:])]


def split_amount(whole: Decimal, weights: Sequence[Decimal | int], quantum: Decimal) -> list[Decimal]:
    """`whole` (a multiple of `quantum`) split in proportion to `weights` by largest remainder on `quantum`."""
    units = EXACT.divide(whole, quantum)
    if units != units.to_integral_value():
        raise ValueError(f"{whole} is not a multiple of {quantum}")
    return [q * quantum for q in largest_remainder(int(units), weights)]


@dataclass(frozen=True)
class TaskCost:
    customer_id: str
    task_id: str
    outcome: str
    attempts: int
    attempts_cost: Decimal
    retried_attempts_cost: Decimal  # every attempt but the last
    retried_weighted_tokens: Decimal
    tool_cost: Decimal

    @property
    def cost(self) -> Decimal:
        return self.attempts_cost + self.tool_cost


def task_costs(tasks: Iterable[TaskRecord], attribution: Attribution, model: CostModel) -> list[TaskCost]:
    rates = attribution.cost_per_weighted_token_by_customer()
    platform_rate = attribution.cost_per_weighted_token()
    out = []
    with localcontext(EXACT):
        for t in tasks:
            rate = rates.get(t.customer_id, platform_rate)
            last = t.last_attempt
            all_w = ZERO
            retried_w = ZERO
            for a in t.attempts:
                w = model.weight(a.input_tokens - a.cached_input_tokens, a.output_tokens)
                all_w += w
                if a.attempt != last:
                    retried_w += w
            tool = sum((model.usage_cost(m, q) for m, q in t.usage.items()), ZERO)
            out.append(TaskCost(t.customer_id, t.task_id, t.outcome, len(t.attempts),
                                all_w * rate, retried_w * rate, retried_w, tool))
    return out


def cost_per_successful_task(costs: Iterable[TaskCost]) -> Decimal | None:
    """(cost of all attempts of every task + tool/verification cost) / successful tasks; None if none succeeded."""
    costs = list(costs)
    successes = sum(1 for c in costs if c.outcome == "succeeded")
    if not successes:
        return None
    with localcontext(EXACT):
        return sum((c.cost for c in costs), ZERO) / successes


def cost_model_from_data(data: Any) -> CostModel:
    return CostModel.model_validate(data)
