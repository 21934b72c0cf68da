"""Pricing experiments: the same metered usage rated under several price books, beside what it cost.

Pure: `compare(dataset, books, cost_model, usage)` gives a `Comparison` per book — revenue, cost,
margin, per-customer revenue against the first (baseline) book, risk (how the margin spreads over
days, or hours for windows shorter than two days, and over customers), who keeps the prefix-caching
gain, and who pays for retried task attempts.

The usage rated is given (`ExperimentUsages`): the adapter loads it the way invoices do
(`pricing_service.rate_period.load_period_usages`: SQL sums and SQL GPU attribution), for the window,
for each risk bucket (`experiment_buckets`) and with caching off for each model. There is one path
from the rollups to `Usage`; the records (`dataset`) feed the cost model. A Python attribution of
the same usage from the records is kept as the test oracle (tests/pricing/usage_oracle.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, localcontext

from pricing.anatomy import Anatomy, AnatomyInputs, Part, anatomy, parts
from pricing.book import PriceBook
from pricing.cost import Attribution, CostModel, TaskCost, attribute, cost_per_successful_task, task_costs
from pricing.meters import GPU_METER, REQUEST_METERS, TASK_ATTEMPTS
from pricing.money import EXACT, SUMS, Currency, exact_sum, precise
from pricing.rating import Rating, line_quantities, rate, rounded_total
from pricing.records import Dataset
from pricing.usage import Usage, UsageKey

ZERO = Decimal(0)


class ExperimentError(ValueError):
    pass


# ---------------------------------------------------------------- the usage rated


@dataclass(frozen=True)
class ExperimentUsages:
    """Each customer's usage, as invoices load it: of the whole window, of each risk bucket
    (`experiment_buckets(start, end)`, in order), and of the window with prefix caching off for
    each model served (cached input tokens of that model counted as uncached, GPU time grown and
    attributed as `pricing.cost.attribute(..., caching_off_for=[model])` does)."""

    window: Mapping[str, Usage]
    buckets: Sequence[Mapping[str, Usage]]
    caching_off: Mapping[str, Mapping[str, Usage]]  # model -> customer -> usage
    # position of a book in `compare(books=...)` -> the usage that book rates, when it counts task
    # outcomes its own way (`PriceBook.task_outcomes`: only trusted sources); other books rate the above
    by_book: Mapping[int, ExperimentUsages] = field(default_factory=dict)


def without_retries(usage: Usage, retried: Sequence[TaskCost], attribution: Attribution,
                    model_weights: dict[str, Decimal]) -> Usage:
    """The usage as if every attempt but the last of each task had not happened. Retried tokens are
    taken off the customer's models in proportion to each model's weighted tokens; GPU-seconds by the
    retried share of the customer's weighted tokens."""
    retried_w = exact_sum(t.retried_weighted_tokens for t in retried)
    retried_attempts = sum((t.attempts - 1 for t in retried if t.attempts > 1), 0)
    total_w = exact_sum(model_weights.values())
    if not retried_w or not total_w:
        return usage
    with localcontext(EXACT):
        keep = max(ZERO, 1 - retried_w / total_w)
        out: list[tuple[UsageKey, Decimal]] = []
        for key, q in usage.quantities.items():
            if key.meter in REQUEST_METERS or key.meter == GPU_METER:
                q = q * keep
            elif key.meter == TASK_ATTEMPTS:
                q = max(ZERO, q - retried_attempts)
            out.append((key, precise(q)))
    return Usage.build(usage.customer_id, usage.period_start, usage.period_end, out)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class CustomerResult:
    customer_id: str
    revenue: Decimal
    cost: Decimal
    baseline_revenue: Decimal

    @property
    def margin(self) -> Decimal:
        return EXACT.subtract(self.revenue, self.cost)

    @property
    def versus_baseline(self) -> Decimal:
        return EXACT.subtract(self.revenue, self.baseline_revenue)


@dataclass(frozen=True)
class Bucket:
    start: datetime
    revenue: Decimal
    cost: Decimal

    @property
    def margin(self) -> Decimal:
        return EXACT.subtract(self.revenue, self.cost)


@dataclass(frozen=True)
class Risk:
    bucket: str  # "day" or "hour"
    buckets: tuple[Bucket, ...]
    customer_margin_stdev: Decimal
    loss_making_customers: int

    @property
    def margins(self) -> list[Decimal]:
        return [b.margin for b in self.buckets]

    @property
    def margin_stdev(self) -> Decimal:
        return stdev(self.margins)


@dataclass(frozen=True)
class CachingGain:
    model: str
    cached_input_tokens: int
    cost_without_caching: Decimal
    cost_with_caching: Decimal
    revenue_without_caching: Decimal
    revenue_with_caching: Decimal

    @property
    def cost_gain(self) -> Decimal:
        """What prefix caching saved the platform."""
        return self.cost_without_caching - self.cost_with_caching

    @property
    def passed_to_customers(self) -> Decimal:
        """How much less customers paid thanks to caching."""
        return self.revenue_without_caching - self.revenue_with_caching

    @property
    def kept_by_platform(self) -> Decimal:
        """The margin caching added: cost gain minus what customers saved."""
        return self.cost_gain - self.passed_to_customers


@dataclass(frozen=True)
class RetryResult:
    retried_attempts: int
    retried_cost: Decimal
    revenue_from_retries: Decimal  # revenue with retries minus revenue without them

    @property
    def absorbed_by_platform(self) -> Decimal:
        return max(ZERO, self.retried_cost - self.revenue_from_retries)

    @property
    def paid_by(self) -> str:
        if not self.retried_cost:
            return "none"
        if self.revenue_from_retries >= self.retried_cost:
            return "customers"
        if self.revenue_from_retries <= 0:
            return "platform"
        return "shared"


@dataclass(frozen=True)
class AnatomyEffect:
    """A term of the cost anatomy under a book: what it cost, how much of it customers are billed
    for (the book's revenue minus its revenue on the same usage without that term's GPU time and
    tokens), and what the platform carries (the margin it would gain if the term went away)."""

    term: str  # queue_and_idle | failure
    cost: Decimal
    billed_to_customers: Decimal

    @property
    def carried_by_platform(self) -> Decimal:
        return self.cost - self.billed_to_customers


def usage_without(usage: Usage, gpu_keep: Mapping[str, Decimal], request_keep: Mapping[str, Decimal]) -> Usage:
    """The usage with GPU-seconds of each deployment and request meters of each model scaled by the
    share kept (1 when not given)."""
    out: list[tuple[UsageKey, Decimal]] = []
    with localcontext(EXACT):
        for key, q in usage.quantities.items():
            if key.meter == GPU_METER:
                q = q * gpu_keep.get(key.deployment, Decimal(1))
            elif key.meter in REQUEST_METERS:
                q = q * request_keep.get(key.model, Decimal(1))
            out.append((key, precise(q)))
    return Usage.build(usage.customer_id, usage.period_start, usage.period_end, out)


def _keep_shares(all_parts: Sequence[Part], term: str, by: str) -> dict[str, dict[str, Decimal]]:
    """customer -> deployment (by='deployment') or model (by='model') -> 1 - the term's share of the
    cost (of the GPU cost for deployments; of the token work for models)."""
    num: dict[tuple[str, str], Decimal] = defaultdict(lambda: ZERO)
    den: dict[tuple[str, str], Decimal] = defaultdict(lambda: ZERO)
    token_terms = ("new_compute", "context_not_reused", "failure")
    with localcontext(EXACT):
        for p in all_parts:
            k = (p.customer_id, p.deployment_id if by == "deployment" else p.model)
            if by == "deployment" or p.term in token_terms:
                den[k] += p.amount
                if p.term == term:
                    num[k] += p.amount
        out: dict[str, dict[str, Decimal]] = defaultdict(dict)
        for (c, x), d in den.items():
            if d:
                out[c][x] = 1 - num[(c, x)] / d
    return out


@dataclass
class BookResult:
    book: PriceBook
    revenue: Decimal
    cost: Decimal
    customers: list[CustomerResult]
    ratings: dict[str, Rating]
    risk: Risk
    caching: list[CachingGain] = field(default_factory=list)
    retries: RetryResult | None = None
    anatomy: list[AnatomyEffect] = field(default_factory=list)

    @property
    def margin(self) -> Decimal:
        return EXACT.subtract(self.revenue, self.cost)

    @property
    def pays_more(self) -> list[CustomerResult]:
        return [c for c in self.customers if c.versus_baseline > 0]

    @property
    def pays_less(self) -> list[CustomerResult]:
        return [c for c in self.customers if c.versus_baseline < 0]


@dataclass
class Comparison:
    start: datetime
    end: datetime
    currency: str
    books: list[BookResult]
    usage_totals: dict[str, Decimal]  # quantities at the project scale, trailing zeros dropped
    cost_total_precise: Decimal
    idle_pool_cost: Decimal
    cost_per_successful_task: Decimal | None
    successful_tasks: int
    cost_by_model: dict[str, Decimal]
    anatomy: Anatomy | None = None  # the GPU cost's five parts (pricing.anatomy), by deployment


def quantity_text(value: Decimal | int) -> Decimal:
    """A quantity at the project scale without trailing zeros (172800, not 172800.000000000000)."""
    q = precise(Decimal(value))
    return q.quantize(Decimal(1)) if q == q.to_integral_value() else q.normalize()


def stdev(values: Sequence[Decimal]) -> Decimal:
    """Population standard deviation, exact to 28 digits then kept at the project scale."""
    if len(values) < 2:
        return ZERO
    with localcontext(EXACT):
        mean = sum(values, ZERO) / len(values)
        variance = sum(((v - mean) ** 2 for v in values), ZERO) / len(values)
        return precise(variance.sqrt())


def experiment_buckets(start: datetime, end: datetime) -> tuple[str, list[tuple[datetime, datetime]]]:
    """The risk buckets of a window: days for windows of two days or more, else hours."""
    step, name = (timedelta(days=1), "day") if end - start >= timedelta(days=2) else (timedelta(hours=1), "hour")
    out = []
    t = start
    while t < end:
        out.append((t, min(end, t + step)))
        t += step
    return name, out


def compare(
    dataset: Dataset, books: Sequence[PriceBook], cost_model: CostModel, usage: ExperimentUsages,
    anatomy_inputs: AnatomyInputs | None = None,
) -> Comparison:
    """Rate `usage` under each book and cost the `dataset` with the cost model (see the module doc).
    The cost anatomy (`pricing.anatomy`, from `anatomy_inputs`: the engine state and request classes)
    says, per book, how much of the idle loss and of the failure cost customers are billed for."""
    if not books:
        raise ExperimentError("give at least one price book")
    currencies = {b.currency for b in books} | {cost_model.currency}
    if len(currencies) > 1:
        raise ExperimentError(
            f"the books and the cost model must share one currency, got {', '.join(sorted(currencies))}"
        )
    currency = Currency.of(cost_model.currency)
    start, end = dataset.start, dataset.end
    attribution = attribute(dataset, cost_model)
    models = sorted({r.model for r in dataset.requests})
    bucket_name, bucket_bounds = experiment_buckets(start, end)
    if len(usage.buckets) != len(bucket_bounds):
        raise ExperimentError(f"expected the usage of {len(bucket_bounds)} {bucket_name} buckets, got {len(usage.buckets)}")
    if missing := [m for m in models if m not in usage.caching_off]:
        raise ExperimentError(f"no usage with caching off for model(s) {', '.join(missing)}")
    usages = usage.window
    customers = sorted(set(usages).union(*(u.window for u in usage.by_book.values()))
                       | {k.customer_id for k in attribution.cost if k.customer_id})

    # one pass over the attributed cost and the usage meters: per customer and per time bucket
    starts = [a for a, _ in bucket_bounds]
    cust_cost: dict[str, Decimal] = dict.fromkeys(customers, ZERO)
    bucket_costs = [ZERO] * len(bucket_bounds)
    cost_precise = ZERO
    items = [(k.customer_id, k.hour, v) for k, v in attribution.cost.items()]
    items += [(m.customer_id, m.hour, cost_model.usage_cost(m.meter, m.quantity))
              for m in dataset.meters if start <= m.hour < end]
    for customer, hour, value in items:
        cost_precise = SUMS.add(cost_precise, value)
        if customer:
            cust_cost[customer] = SUMS.add(cust_cost.get(customer, ZERO), value)
        bucket = max(0, bisect_right(starts, hour) - 1)
        bucket_costs[bucket] = SUMS.add(bucket_costs[bucket], value)
    cost = currency.round(cost_precise)

    tcosts = task_costs(dataset.tasks, attribution, cost_model)
    retried_by_customer: dict[str, list[TaskCost]] = defaultdict(list)
    for t in tcosts:
        if t.attempts > 1:
            retried_by_customer[t.customer_id].append(t)
    model_weights: dict[str, dict[str, Decimal]] = defaultdict(dict)
    for (c, m), w in attribution.weighted_tokens.items():
        model_weights[c][m] = w

    caching_off_cost = {m: attribute(dataset, cost_model, caching_off_for=[m]) for m in models}

    all_parts = parts(dataset, cost_model, anatomy_inputs or AnatomyInputs(), attribution)
    split = anatomy(all_parts, currency.code, group_by="deployment")
    idle_keep = _keep_shares(all_parts, "queue_and_idle", "deployment")
    failure_gpu_keep = _keep_shares(all_parts, "failure", "deployment")
    failure_token_keep = _keep_shares(all_parts, "failure", "model")

    def derived(rated: ExperimentUsages) -> tuple:
        """What a book rates from `rated`: the window, buckets, caching off, without retries, and
        without each anatomy term."""
        window = rated.window
        no_retry = {
            c: without_retries(u, retried_by_customer.get(c, []), attribution, model_weights.get(c, {}))
            for c, u in window.items()
        }
        without = {
            "queue_and_idle": {c: usage_without(u, idle_keep.get(c, {}), {}) for c, u in window.items()},
            "failure": {c: usage_without(u, failure_gpu_keep.get(c, {}), failure_token_keep.get(c, {}))
                        for c, u in window.items()},
        }
        return window, rated.buckets, rated.caching_off, no_retry, without

    shared = derived(usage)

    def empty(c: str) -> Usage:
        return Usage(c, start, end, {})

    results: list[BookResult] = []
    baseline: dict[str, Decimal] | None = None
    for position, book in enumerate(books):
        own = usage.by_book.get(position)
        book_usages, bucket_usages, caching_off_usages, no_retry_usages, without = (
            shared if own is None else derived(own))
        ratings = {c: rate(book, book_usages.get(c) or empty(c)) for c in customers}
        revenue_by = {c: r.total for c, r in ratings.items()}
        revenue = exact_sum(revenue_by.values())
        if baseline is None:
            baseline = revenue_by
        customer_results = [
            CustomerResult(c, revenue_by[c], currency.round(cust_cost[c]), baseline.get(c, ZERO)) for c in customers
        ]
        # risk: progressive ratings per bucket add up to the period's rating
        # progressive by bucket: each bucket's revenue is the cumulative total minus the previous
        # one (exactly what rate_progressive's lines add up to); the minimum and credits on the last
        bucket_revenue = [ZERO] * len(bucket_bounds)
        last = len(bucket_bounds) - 1
        for c in customers:
            cumulative: dict[tuple[int, str], Decimal] = {}
            previous = ZERO
            for i in range(len(bucket_bounds)):
                window = bucket_usages[i].get(c)
                if window is not None:
                    for slot, q in line_quantities(book, window).items():
                        cumulative[slot] = EXACT.add(cumulative.get(slot, ZERO), q)
                elif i != last:
                    continue
                total = rounded_total(book, cumulative, commitments=i == last)
                bucket_revenue[i] = EXACT.add(bucket_revenue[i], EXACT.subtract(total, previous))
                previous = total
        risk = Risk(
            bucket_name,
            tuple(Bucket(a, bucket_revenue[i], currency.round(bucket_costs[i])) for i, (a, _) in enumerate(bucket_bounds)),
            stdev([cr.margin for cr in customer_results]),
            sum(1 for cr in customer_results if cr.margin < 0),
        )
        gains = []
        for m in models:
            att_off, usages_off = caching_off_cost[m], caching_off_usages[m]
            revenue_off = exact_sum(rate(book, usages_off.get(c) or empty(c)).total for c in customers)
            gains.append(
                CachingGain(
                    m,
                    sum(r.cached_input_tokens for r in dataset.requests if r.model == m),
                    currency.round(att_off.total_cost),
                    currency.round(attribution.total_cost),
                    revenue_off,
                    revenue,
                )
            )
        revenue_no_retry = exact_sum(rate(book, no_retry_usages.get(c) or empty(c)).total for c in customers)
        retries = RetryResult(
            sum(t.attempts - 1 for t in tcosts if t.attempts > 1),
            currency.round(exact_sum(t.retried_attempts_cost for t in tcosts)),
            EXACT.subtract(revenue, revenue_no_retry),
        )
        effects = [
            AnatomyEffect(term, split.term(term), EXACT.subtract(revenue, exact_sum(
                rate(book, without[term].get(c) or empty(c)).total for c in customers)))
            for term in ("queue_and_idle", "failure")
        ]
        results.append(
            BookResult(book, revenue, cost, customer_results, ratings, risk, gains, retries,
                       effects)
        )

    totals: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for u in usages.values():
        for key, q in u.quantities.items():
            totals[key.meter] = EXACT.add(totals[key.meter], q)
    return Comparison(
        start,
        end,
        currency.code,
        results,
        {k: quantity_text(v) for k, v in sorted(totals.items())},
        precise(cost_precise),
        currency.round(exact_sum(v for k, v in attribution.cost.items() if not k.customer_id)),
        None if (cpt := cost_per_successful_task(tcosts)) is None else precise(cpt),
        sum(1 for t in tcosts if t.outcome == "succeeded"),
        {m: currency.round(attribution.cost_by(model=m)) for m in models},
        split,
    )
