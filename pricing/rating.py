"""Rating: usage aggregates for a period + a price book -> lines. Pure and exact.

One small function per price type turns a quantity into a precise amount (`rate_unit`,
`rate_tiered_graduated`, `rate_tiered_volume`, `rate_package`, `rate_flat`). `rate` matches each
usage quantity to the most specific charge of its meter (a charge naming a model, deployment or GPU
type beats the unnamed one; on a tie the earlier charge wins), makes one line per charge and model
(per GPU type for GPU time; one line for meters without a dimension), rounds each line once, half-up,
to the currency's minor unit, and adds a top-up line for a minimum commitment and a credit line for
prepaid credits. Line ids are stable hashes, so re-rating gives the same ids.

A book that lays its invoice lines out by project (`invoice: {group_by: project}`) gets each usage line
of a request meter rated as above, then split into one line per project of its usage: the line's
rounded and precise amounts shared over the projects by quantity (`pricing.split.split_by_quantity`),
so the project lines add up to the whole line exactly. Flat charges and the lines of meters without
projects stay whole (project ''). `rate_progressive` does not split lines by project.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, Inexact, localcontext
from hashlib import sha256
from typing import Literal, NamedTuple

from pricing.book import (
    Charge,
    FlatPrice,
    PackagePrice,
    PriceBook,
    TieredGraduatedPrice,
    TieredVolumePrice,
    UnitPrice,
)
from pricing.meters import REQUEST_METERS
from pricing.money import EXACT, QUANT, Currency, exact_sum, mul_div, precise
from pricing.split import split_by_quantity
from pricing.usage import Usage, UsageKey

ZERO = Decimal(0)
_UNMATCHED = object()  # a usage key not matched to a charge yet
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# ---------------------------------------------------------------- one function per price type


def rate_unit(price: UnitPrice, quantity: Decimal) -> Decimal:
    return mul_div(quantity, price.amount, price.per)


def rate_tiered_graduated(price: TieredGraduatedPrice, quantity: Decimal) -> Decimal:
    total = ZERO
    lower = ZERO
    with localcontext(EXACT):
        for tier in price.tiers:
            if quantity <= lower:
                break
            upper = quantity if tier.up_to is None else min(quantity, tier.up_to)
            total += (upper - lower) * tier.amount / price.per + tier.flat_amount
            if tier.up_to is None:
                break
            lower = tier.up_to
    return total


def rate_tiered_volume(price: TieredVolumePrice, quantity: Decimal) -> Decimal:
    if quantity <= 0:
        return ZERO
    for tier in price.tiers:
        if tier.up_to is None or quantity <= tier.up_to:
            with localcontext(EXACT):
                return quantity * tier.amount / price.per + tier.flat_amount
    raise AssertionError("validated tiers always end with an open tier")


def rate_package(price: PackagePrice, quantity: Decimal) -> Decimal:
    with localcontext(EXACT):
        packages = (quantity / price.per).to_integral_value(rounding=ROUND_CEILING)
        return packages * price.amount


def rate_flat(price: FlatPrice, quantity: Decimal) -> Decimal:
    return price.amount if quantity > 0 else ZERO


PRICERS: dict[type, Callable[..., Decimal]] = {
    UnitPrice: rate_unit,
    TieredGraduatedPrice: rate_tiered_graduated,
    TieredVolumePrice: rate_tiered_volume,
    PackagePrice: rate_package,
    FlatPrice: rate_flat,
}


def price_quantity(charge: Charge, quantity: Decimal) -> Decimal:
    """Precise amount of a charge for a quantity, after its free allowance."""
    billable = quantity if not charge.free else max(ZERO, EXACT.subtract(quantity, charge.free))
    return PRICERS[type(charge.price)](charge.price, billable)


# ---------------------------------------------------------------- lines

LineKind = Literal["usage", "minimum", "credit"]


class Line(NamedTuple):
    line_id: str
    kind: LineKind
    customer_id: str
    charge_key: str
    meter: str
    group: str  # the model (request meters), the GPU type (gpu_seconds) or ''
    quantity: Decimal
    unit_price: Decimal | None  # amount per single unit for unit prices; None for the others
    precise_amount: Decimal  # at the project scale (12 places)
    amount: Decimal  # rounded once, half-up, to the currency's minor unit
    project: str = ""  # the project of a line split by project ('' : no project, or a line not split)

    def to_dict(self) -> dict[str, object]:
        return {
            "line_id": self.line_id,
            "kind": self.kind,
            "customer_id": self.customer_id,
            "charge": self.charge_key,
            "meter": self.meter,
            "group": self.group,
            "quantity": str(self.quantity),
            "unit_price": None if self.unit_price is None else str(self.unit_price),
            "precise_amount": str(self.precise_amount),
            "amount": str(self.amount),
            "project": self.project or None,
        }


_new_line = tuple.__new__  # Line built from a full tuple of its fields, without the keyword-handling __new__


@dataclass(frozen=True)
class Rating:
    book_id: str
    currency: str
    customer_id: str
    period_start: datetime
    period_end: datetime
    lines: tuple[Line, ...]

    @property
    def total(self) -> Decimal:
        """The sum of the rounded lines (usage, minimum top-up and credits), exact."""
        return exact_sum(line.amount for line in self.lines)

    @property
    def usage_total(self) -> Decimal:
        return exact_sum(line.amount for line in self.lines if line.kind == "usage")

    def amount_by(self, meter: str | None = None, group: str | None = None) -> Decimal:
        return exact_sum(
            line.amount
            for line in self.lines
            if line.kind == "usage"
            and (meter is None or line.meter == meter)
            and (group is None or line.group == group)
        )


# A line id is sha256("book id|customer|charge key|group|period start|period end")[:24], defined by
# the three helpers below. `rate` hashes each customer's prefix once and copies it per line (the
# hot path); `line_id` builds one id from the same helpers (tests/pricing/test_rating.py checks
# that both give the same ids).
LINE_ID_CHARS = 24


def line_id_prefix(book_id: str, customer_id: str):
    """The sha256 state after "book id|customer|": copy it, then feed it a `line_id_tail`."""
    return sha256(f"{book_id}|{customer_id}|".encode())


def line_id_tail(charge_key: str, group: str, start: datetime, end: datetime) -> bytes:
    return f"{charge_key}|{group}|{start.isoformat()}|{end.isoformat()}".encode()


def line_id(book: PriceBook, customer_id: str, charge_key: str, group: str, start: datetime, end: datetime,
            project: str | None = None) -> str:
    """A line's id; with `project` (a line split by project, '' for no project), that project's line's."""
    ident = line_id_prefix(book.id, customer_id)
    ident.update(line_id_tail(charge_key, group, start, end))
    if project is not None:
        ident.update(project_line_id_tail(project))
    return ident.hexdigest()[:LINE_ID_CHARS]


def project_line_id_tail(project: str) -> bytes:
    """What a project's line hashes after its whole line's text: distinct for every project, '' included,
    and never the id of the whole line (which books not split by project use)."""
    return f"|project={project}".encode()


def match_charge(book: PriceBook, key: UsageKey) -> tuple[int, Charge] | None:
    """The charge that prices a usage key: the most specific match, the earlier one on a tie."""
    best: tuple[int, Charge] | None = None
    for index, charge in enumerate(book.charges):
        if charge.meter != key.meter:
            continue
        if charge.model is not None and charge.model != key.model:
            continue
        if charge.deployment is not None and charge.deployment != key.deployment:
            continue
        if charge.gpu_type is not None and charge.gpu_type != key.gpu_type:
            continue
        if best is None or charge.specificity > best[1].specificity:
            best = (index, charge)
    return best


def _line_quantities(book: PriceBook, usage: Usage) -> dict[tuple[int, str], Decimal]:
    return line_quantities(book, usage)


def line_quantities(book: PriceBook, usage: Usage) -> dict[tuple[int, str], Decimal]:
    """The quantity of each line a usage makes under a book: {(charge index, group): quantity}."""
    compiled = _compiled(book)
    out: dict[tuple[int, str], Decimal] = {}
    for key, quantity in usage.quantities.items():
        if quantity:
            slot = compiled.slot(key)
            if slot is not None:  # else a meter the book does not charge for
                out[slot] = EXACT.add(out.get(slot, ZERO), quantity)
    return out


def rounded_total(book: PriceBook, quantities: dict[tuple[int, str], Decimal], *, commitments: bool) -> Decimal:
    """The total of the lines for these line quantities (each rounded once), with the minimum top-up
    and credits if `commitments`: what `rate` would total, without building the lines."""
    compiled = _compiled(book)
    pricers, minor = compiled.pricers, compiled.minor
    total = exact_sum(pricers[index](quantity).quantize(minor, ROUND_HALF_UP, EXACT)
                      for (index, _), quantity in quantities.items())
    if commitments and (book.minimum is not None or book.credits):
        total = exact_sum((line.amount for line in _commitment_lines(book, compiled.currency, "", total, _EPOCH, _EPOCH)),
                          total)
    return total


def _unit_price(charge: Charge) -> Decimal | None:
    if isinstance(charge.price, UnitPrice):
        return precise(EXACT.divide(charge.price.amount, charge.price.per))
    return None


def _commitment_lines(
    book: PriceBook, currency: Currency, customer_id: str, usage_total: Decimal, start: datetime, end: datetime
) -> list[Line]:
    lines: list[Line] = []
    running = usage_total
    if book.minimum is not None:
        minimum = currency.round(book.minimum)
        if running < minimum:
            top_up = EXACT.subtract(minimum, running)
            lines.append(
                Line(line_id(book, customer_id, "minimum", "", start, end), "minimum", customer_id,
                     "minimum", "minimum", "", Decimal(1), None, precise(top_up), top_up)
            )
            running = minimum
    if book.credits:
        used = min(currency.round(book.credits), running)
        if used > 0:
            lines.append(
                Line(line_id(book, customer_id, "credits", "", start, end), "credit", customer_id,
                     "credits", "credits", "", Decimal(1), None, precise(EXACT.minus(used)), EXACT.minus(used))
            )
    return lines


# Multiplies exactly or raises Inexact: quantity x (amount / per) when that product fits 80 digits.
_EXACT_OR_RAISE = EXACT.copy()
_EXACT_OR_RAISE.traps[Inexact] = True


def _exact_unit(charge: Charge) -> Decimal | None:
    """amount / per of a unit price without a free allowance, when it is a finite decimal (per a
    power of ten, say): then quantity x unit is exactly quantity x amount / per, one product instead
    of a product and a division. None otherwise (3.50 per 3600)."""
    price = charge.price
    if not isinstance(price, UnitPrice) or charge.free:
        return None
    try:
        return _EXACT_OR_RAISE.divide(price.amount, price.per)
    except Inexact:
        return None


def _pricer(charge: Charge) -> Callable[[Decimal | int], Decimal]:
    """quantity -> precise amount for one charge (its free allowance included)."""
    price = charge.price
    if isinstance(price, UnitPrice) and not charge.free:
        amount, per = price.amount, price.per
        unit = _exact_unit(charge)
        if unit is not None:

            def unit_price(q: Decimal | int) -> Decimal:
                try:
                    return _EXACT_OR_RAISE.multiply(q, unit)
                except Inexact:  # a product wider than 80 digits: the general path, as exact as ever
                    return EXACT.divide(EXACT.multiply(q, amount), per)

            return unit_price
        return lambda q: EXACT.divide(EXACT.multiply(q, amount), per)
    return lambda q: price_quantity(charge, q)


class _CompiledBook:
    """What rating needs of a book, worked out once: charge keys, unit prices, which charge (and
    line group) prices each usage key, and for each line slot the fields its lines share."""

    __slots__ = ("book", "currency", "minor", "keys", "unit_prices", "pricers", "units", "matches", "lines", "periods",
                 "by_project")

    def __init__(self, book: PriceBook):
        self.book = book
        self.currency = book.money
        self.minor = self.currency.minor_unit
        self.keys = [c.stable_key for c in book.charges]
        self.unit_prices = [_unit_price(c) for c in book.charges]
        self.pricers = [_pricer(c) for c in book.charges]
        self.units = [_exact_unit(c) for c in book.charges]
        self.matches: dict[UsageKey, tuple[int, str] | None] = {}
        # (charge index, group) -> (charge key, meter, unit price, exact unit or None, pricer)
        self.lines: dict[tuple[int, str], tuple[str, str, Decimal | None, Decimal | None, Callable]] = {}
        # (period start, end) -> {(charge index, group): the line-id text after "book|customer|"}
        self.periods: dict[tuple[datetime, datetime], dict[tuple[int, str], bytes]] = {}
        self.by_project = book.lines_by_project

    def slot(self, key: UsageKey) -> tuple[int, str] | None:
        try:
            return self.matches[key]
        except KeyError:
            matched = match_charge(self.book, key)
            slot = None if matched is None else (matched[0], key.group)
            if slot is not None:
                i = slot[0]
                self.lines[slot] = (self.keys[i], self.book.charges[i].meter, self.unit_prices[i], self.units[i], self.pricers[i])
            self.matches[key] = slot
            return slot

    def line_id_tails(self, start: datetime, end: datetime) -> dict[tuple[int, str], bytes]:
        found = self.periods.get((start, end))
        if found is None:
            if len(self.periods) >= 64:
                self.periods.clear()
            found = self.periods[(start, end)] = {}
        return found


_COMPILED: dict[int, _CompiledBook] = {}


def _compiled(book: PriceBook) -> _CompiledBook:
    found = _COMPILED.get(id(book))
    if found is not None and found.book is book:  # the cache holds the book, so its id is not reused
        return found
    if len(_COMPILED) >= 64:
        _COMPILED.clear()
    found = _COMPILED[id(book)] = _CompiledBook(book)
    return found


def rate(book: PriceBook, usage: Usage) -> Rating:
    """Rate one customer's usage of one period under a book."""
    compiled = _compiled(book)
    matches = compiled.matches
    quantities: dict[tuple[int, str], Decimal | int] = {}
    for key, quantity in usage.quantities.items():
        if quantity:
            slot = matches.get(key, _UNMATCHED)
            if slot is _UNMATCHED:
                slot = compiled.slot(key)
            if slot is not None:  # else a meter the book does not charge for
                quantities[slot] = EXACT.add(quantities[slot], quantity) if slot in quantities else quantity
    if compiled.by_project:
        return _split_by_project(book, usage, _rate_slots(book, compiled, usage, quantities))
    return _rate_slots(book, compiled, usage, quantities)


def _rate_slots(book: PriceBook, compiled: _CompiledBook, usage: Usage, quantities: dict[tuple[int, str], Decimal | int]
                ) -> Rating:
    """The rating of these line quantities ({(charge index, group): quantity}): one line per slot,
    then the minimum and credit lines."""
    customer = usage.customer_id
    start, end = usage.period_start, usage.period_end
    # line ids as `line_id` makes them: the customer's prefix is hashed once and copied per line;
    # the tail of each line slot is kept per period
    prefix = line_id_prefix(book.id, customer)
    tails = compiled.line_id_tails(start, end)
    infos, minor = compiled.lines, compiled.minor
    lines: list[Line] = []
    usage_total = ZERO
    for slot in sorted(quantities):
        quantity = quantities[slot]
        charge_key, meter, unit_price, unit, pricer = infos[slot]
        if unit is not None:
            try:
                exact = _EXACT_OR_RAISE.multiply(quantity, unit)
            except Inexact:
                exact = pricer(quantity)
        else:
            exact = pricer(quantity)
        amount = exact.quantize(minor, ROUND_HALF_UP, EXACT)  # the one rounding, half-up, per line
        usage_total = EXACT.add(usage_total, amount)
        tail = tails.get(slot)
        if tail is None:
            tail = tails[slot] = line_id_tail(charge_key, slot[1], start, end)
        ident = prefix.copy()
        ident.update(tail)
        lines.append(
            _new_line(Line, (ident.hexdigest()[:LINE_ID_CHARS], "usage", customer, charge_key, meter, slot[1], Decimal(quantity),
                             unit_price, exact.quantize(QUANT, ROUND_HALF_UP, EXACT), amount, ""))
        )
    if book.minimum is not None or book.credits:
        lines += _commitment_lines(book, compiled.currency, customer, usage_total, start, end)
    return Rating(book.id, book.currency, customer, start, end, tuple(lines))


def _split_by_project(book: PriceBook, usage: Usage, whole: Rating) -> Rating:
    """`whole` (the rating of `usage`) with each usage line of a request meter whose price is not flat
    replaced by one line per project of its usage, in project name order: quantity the project's,
    rounded and precise amounts the line's shared by quantity (`split_by_quantity`), id `line_id`'s
    with the project. Other lines are kept as they are."""
    compiled = _compiled(book)
    projects: dict[tuple[int, str], dict[str, Decimal]] = {}
    for key, quantity in usage.quantities.items():
        if quantity and key.meter in REQUEST_METERS:
            slot = compiled.slot(key)
            if slot is not None:
                found = projects.setdefault(slot, {})
                found[key.project] = EXACT.add(found.get(key.project, ZERO), quantity)
    by_line = {(compiled.keys[slot[0]], slot[1]): slot for slot in projects}  # charge keys are unique in a book
    minor = compiled.minor
    lines: list[Line] = []
    for line in whole.lines:
        slot = by_line.get((line.charge_key, line.group)) if line.kind == "usage" else None
        if slot is None or isinstance(book.charges[slot[0]].price, FlatPrice):
            lines.append(line)
            continue
        shares = projects[slot]
        amounts = split_by_quantity(line.amount, shares, minor)
        precise_amounts = split_by_quantity(line.precise_amount, shares, QUANT)
        for project in sorted(shares):
            lines.append(line._replace(
                line_id=line_id(book, whole.customer_id, line.charge_key, line.group, whole.period_start,
                                whole.period_end, project),
                quantity=Decimal(shares[project]), precise_amount=precise_amounts[project], amount=amounts[project],
                project=project,
            ))
    return Rating(whole.book_id, whole.currency, whole.customer_id, whole.period_start, whole.period_end, tuple(lines))


def rate_progressive(book: PriceBook, prior: Usage, window: Usage, *, final: bool) -> Rating:
    """Rate the window [b, c) of a billing period that started at a, given the usage of [a, b) that an
    earlier progressive rating already billed. Each line is the difference between the cumulative
    rating of [a, c) and that of [a, b) — precise and rounded alike — so the parts of a period always
    add up to the rating of the whole period. The minimum and credits apply on the final part only.
    """
    cumulative = prior.then(window) if prior.period_end > prior.period_start else window
    if prior.period_end == prior.period_start and prior.period_end != window.period_start:
        raise ValueError("the empty prior must end where the window starts")
    currency = book.money
    before = _line_quantities(book, prior)
    after = _line_quantities(book, cumulative)
    lines: list[Line] = []
    for slot in sorted(set(before) | set(after)):
        index, group = slot
        charge = book.charges[index]
        q0, q1 = before.get(slot, ZERO), after.get(slot, ZERO)
        if q1 == q0:
            continue
        p0, p1 = price_quantity(charge, q0), price_quantity(charge, q1)
        lines.append(
            Line(
                line_id(book, window.customer_id, charge.stable_key, group, window.period_start, window.period_end),
                "usage", window.customer_id, charge.stable_key, charge.meter, group, EXACT.subtract(q1, q0),
                _unit_price(charge), EXACT.subtract(precise(p1), precise(p0)),
                EXACT.subtract(currency.round(p1), currency.round(p0)),
            )
        )
    if final:
        period_usage_total = exact_sum(currency.round(price_quantity(book.charges[i], q)) for (i, _), q in after.items())
        for line in _commitment_lines(book, currency, window.customer_id, period_usage_total,
                                      cumulative.period_start, cumulative.period_end):
            lines.append(line)
    return Rating(book.id, book.currency, window.customer_id, window.period_start, window.period_end, tuple(lines))
