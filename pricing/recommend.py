"""Price recommendation: the smallest scale of a price book's prices that meets a target margin over a
window of metered history while keeping the chance of a loss-making billing period under a risk.

Pure (import-linter's `pricing-pure`): `pricing_service.recommend` loads the history (`History`: each
whole day's usage per customer, as invoices load it, and its cost under the cost model) and renders
the result. docs/pricing.md, "Price recommendation", says the same with an example.

A scale s makes a book whose every price is s times the original (`scale_book`): unit, package and
flat amounts, tier amounts and flat amounts, and the minimum commitment, each rounded up to the
book's precision (the most decimal places any of its amounts has, at least the currency's minor
unit), so no price falls below its exact scaled value; prepaid `credits` are scaled too and rounded
down. Quantities (`per`, `up_to`, free allowances) stay as they are. s = 1 gives the book itself.

s meets the conditions when
1. over the window, the margin is at least `target` x revenue: revenue (each customer's usage of the
   window rated as one period, as `pricing compare` rates it) minus the cost model's cost of the
   window (rounded once), so at s = 1 the margin is the one `pricing compare` reports for the book;
2. over `draws` billing periods of `period_days` days bootstrapped from the window's whole days
   (`pricing.bootstrap.day_draws`: two-stage, weekdays from weekdays; seeded), the share of periods
   whose margin (each customer's period rated under the scaled book, minus the drawn days' cost)
   is below zero is at most `risk`.

The search: revenue grows almost in proportion to s, so one rating at s = 1 gives an estimate (the
larger of the break-even scale for the target and the (1 - risk) quantile of the periods'
break-even scales); from it the bracket is widened until its upper end passes and its lower end
fails, then bisected on the grid of GRID (0.0001) to the smallest passing scale. No scale above
MAX_SCALE (1000x) is tried, the first guess included: a book that needs more is refused. Each step rates
every customer-period exactly (Decimal, each line rounded once, minimum and credits applied), so
the answer is checked, not estimated; bisection assumes that raising s never makes a condition fail
(true of every price type; a book whose credits exceed its charges in a period is the exception,
and the scale found still passes).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_FLOOR, Decimal, InvalidOperation
from functools import cached_property

from pricing.book import PriceBook, price_book_from_data, price_book_to_data
from pricing.bootstrap import DRAWS, day_draws, is_weekend
from pricing.money import EXACT, SCALE, Currency, exact_sum
from pricing.rating import line_quantities, rounded_total
from pricing.usage import Usage

DAY = timedelta(days=1)
GRID = Decimal("0.0001")  # scales are searched on this grid
MAX_SCALE = Decimal(1000)
PERIOD_DAYS = 30
ZERO = Decimal(0)
ONE = Decimal(1)

Slots = dict[tuple[int, str], Decimal]


class RecommendError(ValueError):
    """A recommendation that cannot be made: bad input, no history, or no scale that meets both conditions."""


def _decimal(value: object, name: str) -> Decimal:
    try:
        d = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise RecommendError(f"{name} must be a decimal number such as 0.25, got {value!r}") from None
    if not d.is_finite():
        raise RecommendError(f"{name} must be a finite number, got {value!r}")
    return d


def check_target(value: object) -> Decimal:
    """The target margin, a share of revenue strictly between -1 and 1 (0.25: a 25% gross margin)."""
    target = _decimal(value, "--target-margin")
    if not -1 < target < 1:
        raise RecommendError(f"--target-margin must be greater than -1 and less than 1 (a share of revenue, "
                             f"0.25 for 25%), got {value}")
    return target


def check_risk(value: object) -> Decimal:
    """The largest acceptable probability of a loss-making billing period, strictly between 0 and 1."""
    risk = _decimal(value, "--risk")
    if not 0 < risk < 1:
        raise RecommendError(f"--risk must be greater than 0 and less than 1 (a probability, 0.05 for 5%), got {value}")
    return risk


# ---------------------------------------------------------------- scaling a book


def _places(amount: Decimal) -> int:
    exponent = amount.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _money_fields(data: dict) -> list[tuple[dict, str, str]]:
    """(container, key, path in the YAML) of every money amount of a book's data: prices and commitments."""
    out: list[tuple[dict, str, str]] = []
    for i, charge in enumerate(data["charges"]):
        price = charge["price"]
        if "amount" in price:
            out.append((price, "amount", f"charges[{i}].price.amount"))
        for j, tier in enumerate(price.get("tiers") or []):
            for key in ("amount", "flat_amount"):
                out.append((tier, key, f"charges[{i}].price.tiers[{j}].{key}"))
    for key in ("minimum", "credits"):
        if data.get(key) is not None:
            out.append((data, key, key))
    return out


def book_precision(book: PriceBook) -> int:
    """Decimal places of the scaled prices: the most any amount of the book has, at least the currency's."""
    data = price_book_to_data(book)
    return min(SCALE, max([book.money.minor_units, *(_places(Decimal(c[k])) for c, k, _ in _money_fields(data))]))


def scale_book(book: PriceBook, scale: Decimal, places: int | None = None) -> PriceBook:
    """The book with every money amount times `scale`: prices and the minimum rounded up to `places`
    decimals (default `book_precision`), credits rounded down."""
    places = book_precision(book) if places is None else places
    quantum = Decimal(1).scaleb(-places)
    data = price_book_to_data(book)
    for container, key, _ in _money_fields(data):
        rounding = ROUND_FLOOR if key == "credits" else ROUND_CEILING
        container[key] = str((Decimal(container[key]) * scale).quantize(quantum, rounding))
    return price_book_from_data(data, f"{book.id} x {scale}")


@dataclass(frozen=True)
class PriceChange:
    where: str  # the amount's path in the book: charges[0].price.amount, charges[1].price.tiers[0].amount, minimum
    charge: str  # the charge's stable key (meter and selectors); '' for the minimum and credits
    before: Decimal
    after: Decimal


def price_changes(book: PriceBook, scaled: PriceBook) -> list[PriceChange]:
    """Every non-zero money amount of `book` beside its value in `scaled` (the same book, scaled)."""
    out = []
    for (c0, key, where), (c1, _, _) in zip(_money_fields(price_book_to_data(book)),
                                            _money_fields(price_book_to_data(scaled)), strict=True):
        if Decimal(c0[key]):
            charge = book.charges[int(where[8:where.index("]")])].stable_key if where.startswith("charges[") else ""
            out.append(PriceChange(where, charge, Decimal(c0[key]), Decimal(c1[key])))
    return out


# ---------------------------------------------------------------- the history


@dataclass(frozen=True)
class Chunk:
    """A stretch [start, end) of the window: each customer's usage (as invoices load it) and the cost
    model's cost of it (precise, the idle shared pool and usage meters included)."""

    start: datetime
    end: datetime
    usage: Mapping[str, Usage]
    cost: Decimal


@dataclass(frozen=True)
class History:
    """The window [start, end) as its whole days (the bootstrap draws from these), then the part after
    the last whole day (`rest`, None when the window is whole days); `customers`: every customer of
    the window (those with usage and those with attributed cost, as `pricing compare` rates them)."""

    start: datetime
    end: datetime
    currency: str
    days: Sequence[Chunk]
    rest: Chunk | None
    customers: Sequence[str]

    @property
    def chunks(self) -> list[Chunk]:
        return [*self.days, *([self.rest] if self.rest is not None else [])]


# ---------------------------------------------------------------- the result


def _pick(ordered: Sequence[Decimal], q: float) -> Decimal:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Outcome:
    """A scale's margins: over the window, and over each bootstrapped billing period (in draw order)."""

    scale: Decimal
    revenue: Decimal
    cost: Decimal
    period_revenues: tuple[Decimal, ...]
    period_costs: tuple[Decimal, ...]

    @property
    def margin(self) -> Decimal:
        return self.revenue - self.cost

    @property
    def margin_share(self) -> Decimal | None:
        """margin / revenue (None without revenue)."""
        return None if not self.revenue else self.margin / self.revenue

    @cached_property
    def period_margins(self) -> tuple[Decimal, ...]:
        return tuple(r - c for r, c in zip(self.period_revenues, self.period_costs, strict=True))

    @property
    def losses(self) -> int:
        """Bootstrapped periods whose margin is below zero."""
        return sum(1 for m in self.period_margins if m < 0)

    @property
    def loss_probability(self) -> Decimal:
        return Decimal(self.losses) / len(self.period_revenues) if self.period_revenues else ZERO

    def quantiles(self, money: Currency) -> dict[str, Decimal]:
        """The period margins' mean (rounded to the currency), min, p5, p10, p50, p90, p95 and max."""
        ordered = sorted(self.period_margins)
        if not ordered:
            return {}
        out = {"mean": money.round(EXACT.divide(exact_sum(ordered), len(ordered))), "min": ordered[0]}
        for q in (5, 10, 50, 90, 95):
            out[f"p{q}"] = _pick(ordered, q / 100)
        out["max"] = ordered[-1]
        return out

    def meets(self, target: Decimal, risk: Decimal) -> tuple[bool, bool]:
        """(the window's margin reaches the target, the share of loss-making periods is within the risk)."""
        return (1 - target) * self.revenue >= self.cost, self.losses <= risk * len(self.period_revenues)


@dataclass(frozen=True)
class Recommendation:
    book: PriceBook
    scaled: PriceBook  # the book at the recommended scale
    places: int  # decimal places of its prices
    target: Decimal
    risk: Decimal
    draws: int
    period_days: int
    seed: int
    before: Outcome  # the book as it is (scale 1)
    after: Outcome  # at the recommended scale
    binding: str  # the condition that fails one grid step below the scale: target, risk or both
    changes: list[PriceChange] = field(default_factory=list)

    @property
    def scale(self) -> Decimal:
        return self.after.scale


# ---------------------------------------------------------------- the search


class _Periods:
    """What rating needs of the window and of the bootstrapped periods, worked out once per book:
    each customer's line quantities (they do not depend on prices, only on the book's charges)."""

    def __init__(self, book: PriceBook, history: History, picks: Sequence[Sequence[tuple[int, Decimal]]]):
        money = Currency.of(history.currency)
        self.customers = list(history.customers)
        day_slots: list[dict[str, Slots]] = [
            {c: s for c, u in day.usage.items() if (s := line_quantities(book, u))} for day in history.days]
        window: dict[str, Slots] = {}
        for chunk_slots in [*day_slots, *([{c: line_quantities(book, u) for c, u in history.rest.usage.items()}]
                                           if history.rest is not None else [])]:
            _add(window, chunk_slots, 1)
        self.window = window
        self.cost = money.round(exact_sum(c.cost for c in history.chunks))
        self.periods: list[dict[str, Slots]] = []
        self.period_costs: list[Decimal] = []
        for pick in picks:
            counts = Counter(i for i, _ in pick)
            period: dict[str, Slots] = {}
            for i in sorted(counts):
                _add(period, day_slots[i], counts[i])
            self.periods.append(period)
            self.period_costs.append(money.round(exact_sum(EXACT.multiply(history.days[i].cost, m) for i, m in counts.items())))

    def revenue(self, book: PriceBook, slots_by_customer: dict[str, Slots], empty: Decimal) -> Decimal:
        return exact_sum((rounded_total(book, slots, commitments=True) for slots in slots_by_customer.values()),
                         EXACT.multiply(empty, len(self.customers) - len(slots_by_customer)))

    def outcome(self, book: PriceBook, scale: Decimal) -> Outcome:
        """Every margin at this scale (`book` is the scaled book)."""
        empty = rounded_total(book, {}, commitments=True)  # a customer without usage: the minimum, if any
        return Outcome(scale, self.revenue(book, self.window, empty), self.cost,
                       tuple(self.revenue(book, p, empty) for p in self.periods), tuple(self.period_costs))


class _Search:
    """Whether a scale (in GRID steps) meets both conditions, rating only what is not known yet.

    A period's margin never falls as the scale rises (the module doc), so once a period made money at
    some scale it makes money at every higher one, and once it lost at some scale it loses at every
    lower one: each period keeps those two bounds, only the periods between them are rated, and the
    count stops as soon as the losses exceed what the risk allows."""

    def __init__(self, book: PriceBook, periods: _Periods, base: Outcome, target: Decimal, risk: Decimal,
                 places: int) -> None:
        self.book, self.periods, self.target, self.places = book, periods, target, places
        n = len(periods.periods)
        self.allowed = int((risk * n).to_integral_value(ROUND_FLOOR))
        self.profitable_from = [math.inf] * n  # the lowest step known to make money
        self.losing_to = [-math.inf] * n  # the highest step known to lose
        one = int(1 / GRID)
        margins = base.period_margins
        for i, m in enumerate(margins):
            self._learn(i, one, m >= 0)
        # the periods most likely to lose first (lowest margin share at scale 1): a failing scale stops early
        self.order = sorted(range(n), key=lambda i: (margins[i] / base.period_revenues[i]
                                                     if base.period_revenues[i] else Decimal("-Infinity")))
        self.books: dict[int, tuple[PriceBook, Decimal]] = {}  # steps -> (the scaled book, an empty customer's revenue)
        self.window_checked: dict[int, bool] = {}
        self.risk_checked: dict[int, bool] = {}
        self.window_checked[one], self.risk_checked[one] = base.meets(target, risk)

    def _learn(self, i: int, steps: int, profitable: bool) -> None:
        if profitable:
            self.profitable_from[i] = min(self.profitable_from[i], steps)
        else:
            self.losing_to[i] = max(self.losing_to[i], steps)

    def scaled(self, steps: int) -> PriceBook:
        return self.book if steps * GRID == 1 else scale_book(self.book, steps * GRID, self.places)

    def _book(self, steps: int) -> tuple[PriceBook, Decimal]:
        found = self.books.get(steps)
        if found is None:
            book = self.scaled(steps)
            found = self.books[steps] = (book, rounded_total(book, {}, commitments=True))
        return found

    def window_ok(self, steps: int) -> bool:
        """Over the window, the margin reaches the target at this scale."""
        found = self.window_checked.get(steps)
        if found is None:
            book, empty = self._book(steps)
            revenue = self.periods.revenue(book, self.periods.window, empty)
            found = self.window_checked[steps] = (1 - self.target) * revenue >= self.periods.cost
        return found

    def risk_ok(self, steps: int) -> bool:
        """Loss-making periods are within the risk at this scale."""
        found = self.risk_checked.get(steps)
        if found is not None:
            return found
        book, empty = self._book(steps)
        p = self.periods
        losses = 0
        for i in self.order:
            if steps >= self.profitable_from[i]:
                continue
            if steps <= self.losing_to[i]:
                losses += 1
            else:
                profitable = p.revenue(book, p.periods[i], empty) >= p.period_costs[i]
                self._learn(i, steps, profitable)
                losses += not profitable
            if losses > self.allowed:
                break
        found = self.risk_checked[steps] = losses <= self.allowed
        return found

    def passes(self, steps: int) -> bool:
        return steps > 0 and self.window_ok(steps) and self.risk_ok(steps)


def _add(into: dict[str, Slots], chunk: Mapping[str, Slots], times: int) -> None:
    """Add `times` x each customer's line quantities of `chunk` to `into`."""
    for customer, slots in chunk.items():
        acc = into.get(customer)
        if acc is None:
            into[customer] = dict(slots) if times == 1 else {slot: EXACT.multiply(q, times) for slot, q in slots.items()}
            continue
        for slot, q in slots.items():
            acc[slot] = EXACT.add(acc.get(slot, ZERO), q if times == 1 else EXACT.multiply(q, times))


def period_template(start: datetime, period_days: int) -> list[tuple[bool, Decimal]]:
    """The slots of a bootstrapped billing period: `period_days` whole days from `start` (so the
    weekday pattern of the window's first days), each filled by a drawn day of the same kind."""
    return [(is_weekend(start + k * DAY), ONE) for k in range(period_days)]


def _estimate(base: Outcome, target: Decimal, risk: Decimal) -> Decimal | None:
    """The scale the conditions need if revenue were exactly proportional to the scale (None: no scale
    can meet them: revenue 0 where there is a cost)."""
    def needed(revenue: Decimal, cost: Decimal, share: Decimal) -> Decimal | None:
        if cost <= 0:
            return ZERO
        if revenue <= 0:
            return None
        return cost / (revenue * (1 - share))

    window = needed(base.revenue, base.cost, target)
    if window is None:
        return None
    per_period = sorted((needed(r, c, ZERO) for r, c in zip(base.period_revenues, base.period_costs, strict=True)),
                        key=lambda s: (s is None, s or ZERO))
    allowed = int((risk * len(per_period)).to_integral_value(ROUND_FLOOR))
    periods = ZERO
    if allowed < len(per_period):
        periods = per_period[len(per_period) - allowed - 1]
        if periods is None:
            return None
    return max(window, periods)


def recommend(book: PriceBook, history: History, *, target: object, risk: object, draws: int = DRAWS,
              period_days: int = PERIOD_DAYS, seed: int = 1) -> Recommendation:
    """The smallest scale (on the GRID) at which `book` meets both conditions of the module doc over
    `history`, with the margins before (s = 1) and after."""
    target, risk = check_target(target), check_risk(risk)
    if draws < 1 or period_days < 1:
        raise RecommendError("--draws and --period-days must be at least 1")
    if book.currency != history.currency:
        raise RecommendError(f"the book {book.id} is in {book.currency} and the cost model in {history.currency}: "
                             "they must share one currency")
    if not history.days:
        raise RecommendError(f"the window [{_text(history.start)}, {_text(history.end)}) holds no whole day to draw "
                             "billing periods from: give a window of at least one day")
    if not history.customers:
        raise RecommendError(f"no metered usage in [{_text(history.start)}, {_text(history.end)}): check --from/--to "
                             "against `infermeter usage`")
    picks = day_draws([d.start for d in history.days], period_template(history.start, period_days), draws=draws,
                      seed=f"recommend/{seed}")
    periods = _Periods(book, history, picks)
    places = book_precision(book)
    before = periods.outcome(book, ONE)
    estimate = _estimate(before, target, risk)
    if estimate is None:
        raise RecommendError(_infeasible(book, before, target, risk))
    search = _Search(book, periods, before, target, risk, places)
    limit = int(MAX_SCALE / GRID)
    # the first guess is capped at the limit like every later step, so no scale above MAX_SCALE is ever
    # tried, let alone returned (bisection only lowers hi)
    hi = min(limit, max(1, int((estimate / GRID).to_integral_value(ROUND_CEILING))))
    while not search.passes(hi):  # widen the bracket: up until a scale passes ...
        if hi >= limit:
            raise RecommendError(f"no scale up to {MAX_SCALE}x makes {book.id} meet the target margin {target} with "
                                 f"a loss risk of at most {risk}")
        hi = min(limit, hi + max(1, hi // 20))
    lo = hi - max(1, hi // 20)
    while search.passes(lo):  # ... and down until one fails (0 always does)
        hi, lo = lo, max(0, lo - max(1, lo // 5))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.passes(mid):
            hi = mid
        else:
            lo = mid
    window_ok, risk_ok = (search.window_ok(lo), search.risk_ok(lo)) if lo > 0 else (False, False)
    binding = "both" if not (window_ok or risk_ok) else "target" if not window_ok else "risk"
    scaled = search.scaled(hi)
    after = periods.outcome(scaled, hi * GRID)
    return Recommendation(book, scaled, places, target, risk, draws, period_days, seed, before, after, binding,
                          price_changes(book, scaled))


def _infeasible(book: PriceBook, base: Outcome, target: Decimal, risk: Decimal) -> str:
    if base.revenue <= 0:
        return (f"{book.id} bills nothing in this window while serving it cost {base.cost}: no scale of its prices "
                f"can reach a margin")
    empty = sum(1 for r, c in zip(base.period_revenues, base.period_costs, strict=True) if r <= 0 < c)
    return (f"{book.id} bills nothing in {empty} of {len(base.period_revenues)} bootstrapped periods that cost "
            f"money: no scale of its prices keeps the loss risk at or below {risk}")


def percent(share: Decimal | None) -> str:
    """A share as a percentage to 0.01, rounded towards zero (49.999% reads 49.99%)."""
    return "-" if share is None else f"{(share * 100).quantize(Decimal('0.01'), ROUND_DOWN)}%"


def _text(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
