"""The cost anatomy: the GPU cost the cost model computes, divided into five parts that add up.

    total = new compute + context not reused + cache occupancy + queue and idle + failure

Pure; docs/cost-model.md ("Cost anatomy") explains the method with a worked example.

Each (customer, model, deployment, hour) share of GPU cost (`pricing.cost.attribute`: the cost
model's own attribution, so the anatomy's total is the cost model's GPU cost) is divided by what
the engine did in that deployment-hour (`EngineRecord`, from the GPU ledger):

- G = the hour's GPU-ms, B = its busy GPU-ms (min(B, G));
- queue and idle: the idle time G - B, plus the part of the busy time spent on requests waiting in
  the engine's queue: (B - cache) x queue_ms / (queue_ms + running_ms) (request-ms waiting against
  request-ms running);
- cache occupancy: kv_cache_share x kv_cache_gpu_ms (the GPU memory-time the KV cache held, at the
  share of a GPU's cost that pays for its KV-cache memory; capped at B);
- the rest is token work, shared by the weighted tokens of the share's requests
  (`RequestClassRecord`, from the raw request events): new compute (prefill of uncached input and
  decode of requests that succeeded), context not reused (prefill of uncached input of requests
  whose prefix the platform had already served: `prefix_seen`), failure (requests that ended error,
  cancelled or rejected; task attempts that were retried or whose task failed; and, per extra
  upstream attempt of a failover, one prefill of the request's uncached input). The rollup's weight
  that the raw events do not classify is new compute.

A deployment-hour with GPU time and no tokens is idle (the cost model gives it to the dedicated
deployment's customer, or to the platform for the shared pool): all queue and idle.

Money is split to the currency's minor unit by largest remainder (`pricing.cost.largest_remainder`):
the rows add up to the total (the cost model's GPU cost, rounded once) and each row's five parts add
up to the row, to the cent.

Each failed or wasted unit has a cause (`CAUSES`): runtime (upstream error, engine crash, server
shutdown), capacity (rejected by budget or rate limit, timeout in queue; context not reused on the
same replica: evicted), routing (failover attempts; rejected by data residency: no replica in the
customer's regions could take it; context not reused because the request went to another replica
than the one that had the prefix), client (cancelled by the client),
model and verifier (a task outcome's failure_cause; a retried attempt whose task names no cause
counts under model).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from operator import attrgetter
from typing import NamedTuple

from pricing.cost import Attribution, CostModel, attribute, largest_remainder
from pricing.money import EXACT, SUMS, Currency, exact_sum
from pricing.records import Dataset

ZERO = Decimal(0)
TERMS = ("new_compute", "context_not_reused", "cache_occupancy", "queue_and_idle", "failure")
CAUSES = ("runtime", "capacity", "routing", "client", "model", "verifier")
GROUPS = ("deployment", "model", "customer")
FAILED_STATUSES = ("error", "cancelled", "rejected")
# request tags that say an error was a timeout while waiting in the engine's queue (capacity)
QUEUE_TIMEOUT_TAGS = frozenset({"queue_timeout", "timeout_in_queue"})
# a cancellation the platform caused (runtime), not the client
PLATFORM_CANCEL_REASONS = frozenset({"server_shutdown"})
# a rejection by where the request could go (routing), not by a budget or rate limit (capacity)
ROUTING_REJECT_REASONS = frozenset({"residency"})


@dataclass(frozen=True)
class EngineRecord:
    """What a deployment's engines did in an hour, summed over replicas (gpu_ledger_hourly)."""

    deployment_id: str
    hour: datetime
    busy_gpu_ms: Decimal  # busy wall ms x gpu_count
    kv_cache_gpu_ms: int = 0
    queue_ms: int = 0  # request-ms waiting in the engine's queue
    running_ms: int = 0  # request-ms running


@dataclass(frozen=True)
class RequestClassRecord:
    """Sums of the raw request events of one class in a (customer, model, deployment, hour)."""

    customer_id: str
    model: str
    deployment_id: str
    hour: datetime
    status: str
    requests: int
    uncached_input_tokens: int
    output_tokens: int
    error: str = ""  # tags.error
    reason: str = ""  # tags.reason
    wasted_attempt: bool = False  # a task attempt that was retried, or of a task that failed/was abandoned
    task_cause: str = ""  # the task outcome's failure_cause
    failovers: int = 0  # upstream attempts beyond the first, per request
    prefix: str = ""  # '' not seen before, 'same' replica, 'other' replica


class Part(NamedTuple):
    """Exact money of one term (and cause, for failure and context not reused) of one share (a named
    tuple: a month has millions, and a frozen dataclass costs several times more to build)."""

    customer_id: str  # '' = the platform (idle shared pool)
    model: str  # '' = an idle hour
    deployment_id: str
    hour: datetime
    term: str
    cause: str
    amount: Decimal
    units: int  # requests (failover: extra upstream attempts)


def request_cause(status: str, error: str = "", reason: str = "") -> str:
    if status == "rejected":
        return "routing" if reason in ROUTING_REJECT_REASONS else "capacity"
    if status == "cancelled":
        return "runtime" if reason in PLATFORM_CANCEL_REASONS else "client"
    if error in QUEUE_TIMEOUT_TAGS or reason in QUEUE_TIMEOUT_TAGS:
        return "capacity"
    return "runtime"


def classify(rec: RequestClassRecord, model: CostModel) -> list[tuple[str, str, Decimal, int]]:
    """(term, cause, weighted tokens, units) of a class of requests; see the module doc."""
    prefill = model.prefill_weight * rec.uncached_input_tokens
    decode = model.decode_weight * rec.output_tokens
    out: list[tuple[str, str, Decimal, int]] = []
    if rec.status in FAILED_STATUSES:
        out.append(("failure", request_cause(rec.status, rec.error, rec.reason), prefill + decode, rec.requests))
    elif rec.wasted_attempt:
        out.append(("failure", rec.task_cause or "model", prefill + decode, rec.requests))
    elif rec.prefix:
        out.append(("context_not_reused", "routing" if rec.prefix == "other" else "capacity", prefill, rec.requests))
        out.append(("new_compute", "", decode, 0))
    else:
        out.append(("new_compute", "", prefill + decode, rec.requests))
    if rec.failovers > 0:
        out.append(("failure", "routing", rec.failovers * prefill, rec.failovers * rec.requests))
    return out


@dataclass(frozen=True)
class AnatomyInputs:
    engine: tuple[EngineRecord, ...] = ()
    classes: tuple[RequestClassRecord, ...] = ()


def parts(dataset: Dataset, model: CostModel, inputs: AnatomyInputs,
          attribution: Attribution | None = None) -> list[Part]:
    """Every share of the cost model's GPU cost divided into its terms, exactly (module doc)."""
    att = attribution or attribute(dataset, model)
    gpu_ms: dict[tuple[str, datetime], int] = defaultdict(int)
    for g in dataset.gpu:
        gpu_ms[(g.deployment_id, g.hour)] += g.gpu_ms
    engine: dict[tuple[str, datetime], list[Decimal]] = {}
    for e in inputs.engine:
        slot = engine.setdefault((e.deployment_id, e.hour), [ZERO, ZERO, ZERO, ZERO])
        slot[0] += Decimal(e.busy_gpu_ms)
        slot[1] += e.kv_cache_gpu_ms
        slot[2] += e.queue_ms
        slot[3] += e.running_ms
    classes: dict[tuple[str, str, str, datetime], list[tuple[str, str, Decimal, int]]] = defaultdict(list)
    for rec in inputs.classes:
        classes[(rec.customer_id, rec.model, rec.deployment_id, rec.hour)].extend(classify(rec, model))
    # the rollup's weighted tokens, needed only for the shares with classified requests
    weight: dict[tuple[str, str, str, datetime], Decimal] = defaultdict(lambda: ZERO)
    pw, dw = model.prefill_weight, model.decode_weight
    if classes:
        for r in dataset.requests:
            base = (r.customer_id, r.model, r.deployment_id, r.hour)
            if base in classes:
                weight[base] += pw * (r.input_tokens - r.cached_input_tokens) + dw * r.output_tokens

    out: list[Part] = []
    append = out.append  # a month has millions of shares: this loop is the anatomy's cost (bench.anatomy)
    fractions: dict[tuple[str, datetime], tuple[Decimal, Decimal, Decimal]] = {}
    costs = att.cost
    with localcontext(EXACT):
        for k in sorted(costs, key=_share_order):
            cost = costs[k]
            customer, m, deployment, hour = k.customer_id, k.model, k.deployment_id, k.hour
            if not m:  # an idle hour: the dedicated deployment's customer's, or the platform's
                append(Part(customer, "", deployment, hour, "queue_and_idle", "", cost, 0))
                continue
            dh = (deployment, hour)
            f = fractions.get(dh)
            if f is None:
                f = fractions[dh] = _fractions(gpu_ms[dh], engine.get(dh), model.kv_cache_share)
            idle_f, cache_f, _ = f
            # The share's parts add up to it exactly, so that every total of parts is the cost model's
            # total to the last digit (at a half cent, 80-digit rounding otherwise tips the cent either
            # way): idle <= cost (idle_f <= 1), cache at most what idle leaves, the token work the rest.
            idle = cost * idle_f if idle_f else ZERO
            left = SUMS.subtract(cost, idle)
            cache = min(cost * cache_f, left) if cache_f else ZERO
            token = SUMS.subtract(left, cache)
            append(Part(customer, m, deployment, hour, "queue_and_idle", "", idle, 0))
            append(Part(customer, m, deployment, hour, "cache_occupancy", "", cache, 0))
            base = (customer, m, deployment, hour)
            named = classes.get(base)
            if not named or all(term == "new_compute" for term, _, _, _ in named):
                # nothing wasted or missed in the share (most shares): all its token work is new compute
                append(Part(customer, m, deployment, hour, "new_compute", "", token,
                            sum(units for _, _, _, units in named or ())))
                continue
            classified = sum((w for term, _, w, _ in named if term != "new_compute"), ZERO)
            failovers = sum((w for term, cause, w, _ in named if term == "failure" and cause == "routing"), ZERO)
            # the rollup's weight not classified as wasted is new compute (failover extras ride on top)
            new = max(ZERO, weight[base] - (classified - failovers))
            pieces: dict[tuple[str, str], list] = {("new_compute", ""): [new, 0]}
            for term, cause, w, units in named:
                slot = pieces.setdefault((term, cause if term != "new_compute" else ""), [ZERO, 0])
                if term != "new_compute":
                    slot[0] += w
                slot[1] += units
            total = sum((w for w, _ in pieces.values()), ZERO)
            ordered = sorted(pieces.items())
            if total:
                amounts = [token * w / total for _, (w, _) in ordered]
                # the heaviest piece takes what the others leave of the token work (exactly; positive)
                rest = max(range(len(ordered)), key=lambda i: ordered[i][1][0])
                amounts[rest] = SUMS.subtract(token, exact_sum(a for i, a in enumerate(amounts) if i != rest))
            else:
                amounts = [token if term == "new_compute" else ZERO for (term, _), _ in ordered]
            for ((term, cause), (_, units)), amount in zip(ordered, amounts, strict=True):
                out.append(Part(*base, term, cause, amount, units))
    return out


def _share_order(k) -> tuple:
    return k.deployment_id, k.hour, k.customer_id, k.model, k.gpu_type


def _fractions(gpu_ms: int, engine: list[Decimal] | None, kv_share: Decimal) -> tuple[Decimal, Decimal, Decimal]:
    """(queue and idle, cache occupancy, token work) fractions of a deployment-hour's GPU time."""
    if not gpu_ms:
        return ZERO, ZERO, Decimal(1)
    g = Decimal(gpu_ms)
    if engine is None:  # nothing known about the engine: all of it is token work
        return ZERO, ZERO, Decimal(1)
    busy_ms, kv_ms, queue_ms, running_ms = engine
    busy = min(g, max(ZERO, busy_ms))
    cache = min(busy, kv_share * kv_ms)
    queued = (busy - cache) * queue_ms / (queue_ms + running_ms) if queue_ms + running_ms else ZERO
    token = busy - cache - queued
    return (g - busy + queued) / g, cache / g, token / g


# ---------------------------------------------------------------- rows, to the cent


@dataclass(frozen=True)
class AnatomyRow:
    key: str
    new_compute: Decimal
    context_not_reused: Decimal
    cache_occupancy: Decimal
    queue_and_idle: Decimal
    failure: Decimal

    @property
    def total(self) -> Decimal:
        return self.new_compute + self.context_not_reused + self.cache_occupancy + self.queue_and_idle + self.failure

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, **{t: str(getattr(self, t)) for t in TERMS}, "total": str(self.total)}


@dataclass(frozen=True)
class Anatomy:
    currency: str
    group_by: str
    rows: tuple[AnatomyRow, ...]
    exact: Mapping[str, Decimal] = field(default_factory=dict)  # term -> exact amount, all rows

    @property
    def total(self) -> Decimal:
        return exact_sum(r.total for r in self.rows)

    def term(self, name: str) -> Decimal:
        return exact_sum(getattr(r, name) for r in self.rows)

    def to_json(self) -> dict:
        return {"currency": self.currency, "group_by": self.group_by, "total": str(self.total),
                "rows": [r.to_json() for r in self.rows]}


_KEYS = {"deployment": attrgetter("deployment_id"), "model": attrgetter("model"),
         "customer": attrgetter("customer_id")}


def to_cents(amounts: Sequence[Decimal], whole: Decimal, currency: Currency) -> list[Decimal]:
    """`whole` (rounded to the minor unit) split in proportion to `amounts` by largest remainder."""
    quantum = currency.minor_unit
    units = int(currency.round(whole).scaleb(currency.minor_units))
    return [Decimal(u) * quantum for u in largest_remainder(units, list(amounts))]


def anatomy(all_parts: Iterable[Part], currency_code: str, *, group_by: str = "deployment",
            deployment: str | None = None) -> Anatomy:
    """Rows of the five terms per group key (deployment, model or customer; '' = idle time / the
    platform), to the minor unit: the total is the parts' exact sum rounded once (the cost model's
    GPU cost), split among rows and then among each row's terms by largest remainder."""
    if group_by not in GROUPS:
        raise ValueError(f"group by one of {', '.join(GROUPS)}, not {group_by!r}")
    currency = Currency.of(currency_code)
    by_row: dict[str, dict[str, Decimal]] = defaultdict(lambda: dict.fromkeys(TERMS, ZERO))
    exact = dict.fromkeys(TERMS, ZERO)
    key = _KEYS[group_by]
    with localcontext(SUMS):  # exact: the parts' total is the cost model's, whatever the grouping
        for p in all_parts:
            if deployment is not None and p.deployment_id != deployment:
                continue
            by_row[key(p)][p.term] += p.amount
            exact[p.term] += p.amount
        keys = sorted(by_row)
        totals = [sum(by_row[k].values(), ZERO) for k in keys]
        whole = sum(totals, ZERO)
    row_cents = to_cents(totals, whole, currency) if keys else []
    rows = []
    for k, cents in zip(keys, row_cents, strict=True):
        terms = to_cents([by_row[k][t] for t in TERMS], cents, currency)
        rows.append(AnatomyRow(k, *terms))
    return Anatomy(currency.code, group_by, tuple(rows), exact)


# ---------------------------------------------------------------- failures by cause


@dataclass(frozen=True)
class FailureRow:
    cause: str
    kind: str  # "failure" or "context_not_reused"
    model: str
    customer_id: str
    cost: Decimal
    count: int


@dataclass(frozen=True)
class Failures:
    currency: str
    rows: tuple[FailureRow, ...]

    def by_cause(self) -> dict[str, tuple[Decimal, int]]:
        out = {c: (ZERO, 0) for c in CAUSES}
        for r in self.rows:
            cost, count = out[r.cause]
            out[r.cause] = (cost + r.cost, count + r.count)
        return out

    def count(self, cause: str, kind: str | None = None) -> int:
        return sum(r.count for r in self.rows if r.cause == cause and (kind is None or r.kind == kind))


def failures(all_parts: Iterable[Part], currency_code: str) -> Failures:
    """The failure and context-not-reused parts by (cause, kind, model, customer), with the units
    (requests; failover: extra upstream attempts), to the minor unit by largest remainder."""
    currency = Currency.of(currency_code)
    sums: dict[tuple[str, str, str, str], list] = {}
    with localcontext(SUMS):
        for p in all_parts:
            if p.term not in ("failure", "context_not_reused"):
                continue
            slot = sums.setdefault((p.cause, p.term, p.model, p.customer_id), [ZERO, 0])
            slot[0] += p.amount
            slot[1] += p.units
        keys = sorted(sums, key=lambda k: (CAUSES.index(k[0]), k[1:]))
        whole = sum((sums[k][0] for k in keys), ZERO)
    cents = to_cents([sums[k][0] for k in keys], whole, currency) if keys else []
    rows = tuple(FailureRow(*k, c, sums[k][1]) for k, c in zip(keys, cents, strict=True) if sums[k][1] or c)
    return Failures(currency.code, rows)


def grew_most(now: Failures, before: Failures) -> tuple[str, Decimal] | None:
    """The cause whose cost grew most from the previous window to this one (None if none grew)."""
    a, b = now.by_cause(), before.by_cause()
    growth = [(a[c][0] - b[c][0], -i, c) for i, c in enumerate(CAUSES)]
    delta, _, cause = max(growth)
    return (cause, delta) if delta > 0 else None
