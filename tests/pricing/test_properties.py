"""Hypothesis properties of rating."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from pricing.book import price_book_from_data
from pricing.rating import rate, rate_progressive
from pricing.usage import Usage, UsageKey
from tests.examples import examples
from tests.pricing.helpers import T0, T1, T2

decimals = st.decimals(min_value=0, max_value=1000, places=4).map(str)
per = st.sampled_from([1, 1000, 3600, 1000000])


@st.composite
def tiers(draw):
    bounds = sorted(draw(st.sets(st.integers(1, 10**7), min_size=0, max_size=3)))
    return [{"up_to": b, "amount": draw(decimals), "flat_amount": draw(st.sampled_from(["0", "0", "5"]))} for b in bounds] + [
        {"up_to": None, "amount": draw(decimals)}
    ]


def prices(monotone: bool):
    options = [
        st.builds(lambda a, p: {"type": "unit", "amount": a, "per": p}, decimals, per),
        st.builds(lambda t, p: {"type": "tiered_graduated", "tiers": t, "per": p}, tiers(), per),
        st.builds(lambda a, p: {"type": "package", "amount": a, "per": p}, decimals, per),
        st.builds(lambda a: {"type": "flat", "amount": a}, decimals),
    ]
    if not monotone:
        options.append(st.builds(lambda t, p: {"type": "tiered_volume", "tiers": t, "per": p}, tiers(), per))
    return st.one_of(options)


METERS = ["uncached_input_tokens", "output_tokens", "successful_tasks", "gpu_seconds"]
MODELS = ["m1", "m2"]


@st.composite
def books(draw, monotone: bool = False):
    charges = [{"meter": m, "price": draw(prices(monotone))} for m in METERS]
    charges.append({"meter": "output_tokens", "model": "m2", "price": draw(prices(monotone))})
    book = {"id": "prop", "currency": draw(st.sampled_from(["USD", "JPY", "BHD"])), "charges": charges}
    if draw(st.booleans()):
        book["minimum"] = draw(decimals)
    return price_book_from_data(book, "generated")


def key(meter: str, model: str) -> UsageKey:
    if meter == "gpu_seconds":
        return UsageKey(meter, deployment="d", gpu_type="H100")
    if meter == "successful_tasks":
        return UsageKey(meter)
    return UsageKey(meter, model=model)


usage_rows = st.lists(
    st.tuples(st.sampled_from(METERS), st.sampled_from(MODELS), st.integers(0, 5 * 10**7)), max_size=8
)


def make(rows, start, end) -> Usage:
    return Usage.build("c", start, end, [(key(m, mod), Decimal(q)) for m, mod, q in rows])


def per_line(ratings):
    out: dict[tuple[str, str, str], tuple[Decimal, Decimal]] = {}
    for rating in ratings:
        for line in rating.lines:
            k = (line.kind, line.charge_key, line.group)
            p, a = out.get(k, (Decimal(0), Decimal(0)))
            out[k] = (p + line.precise_amount, a + line.amount)
    return {k: v for k, v in out.items() if v != (0, 0)}


@settings(max_examples=examples(150), deadline=None)
@given(books(), usage_rows, usage_rows)
def test_progressive_rating_adds_up_to_the_whole_period(book, first, second):
    a, b = make(first, T0, T1), make(second, T1, T2)
    whole = rate(book, a.then(b))
    part1 = rate_progressive(book, a.empty_before(), a, final=False)
    part2 = rate_progressive(book, a, b, final=True)
    assert part1.total + part2.total == whole.total
    assert per_line([part1, part2]) == per_line([whole])


@settings(max_examples=examples(150), deadline=None)
@given(books(monotone=True), usage_rows, usage_rows)
def test_totals_never_decrease_as_usage_grows(book, base, extra):
    smaller = make(base, T0, T2)
    larger = make(base + extra, T0, T2)
    assert rate(book, larger).total >= rate(book, smaller).total


@settings(max_examples=examples(150), deadline=None)
@given(books(), usage_rows)
def test_rounding_error_per_line_is_at_most_half_a_minor_unit(book, rows):
    half = book.money.minor_unit / 2
    for line in rate(book, make(rows, T0, T2)).lines:
        assert abs(line.amount - line.precise_amount) <= half
        assert line.amount == line.amount.quantize(book.money.minor_unit)


@settings(max_examples=examples(100), deadline=None)
@given(books(), usage_rows)
def test_re_rating_gives_the_same_ids_and_amounts(book, rows):
    u = make(rows, T0, T2)
    shuffled = make(list(reversed(rows)), T0, T2)
    first, again = rate(book, u), rate(book, shuffled)
    assert [(x.line_id, x.amount, x.precise_amount) for x in first.lines] == [
        (x.line_id, x.amount, x.precise_amount) for x in again.lines
    ]


@settings(max_examples=examples(100), deadline=None)
@given(books(), usage_rows, usage_rows)
def test_rounded_total_of_cumulative_line_quantities_matches_rate(book, first, second):
    from pricing.rating import line_quantities, rounded_total

    a, b = make(first, T0, T1), make(second, T1, T2)
    cumulative = dict(line_quantities(book, a))
    for slot, q in line_quantities(book, b).items():
        cumulative[slot] = cumulative.get(slot, 0) + q
    assert rounded_total(book, cumulative, commitments=True) == rate(book, a.then(b)).total
    assert rounded_total(book, line_quantities(book, a), commitments=False) == rate(book, a).usage_total


def _reference_lines(book, usage):
    """The usage lines of `rate`, worked out the plain way: match, sum, price (amount x quantity / per),
    round once, hash the id from the whole text. `rate`'s shortcuts (one product by an exact unit price,
    copied id prefixes, cached matches) must give exactly these."""
    from pricing.money import EXACT, precise
    from pricing.rating import line_id, match_charge, price_quantity

    sums: dict[tuple[int, str], Decimal] = {}
    for k, q in usage.quantities.items():
        matched = match_charge(book, k)
        if q and matched is not None:  # quantities up to 38 integer digits: summed exactly, not to 28 digits
            sums[(matched[0], k.group)] = EXACT.add(sums.get((matched[0], k.group), Decimal(0)), q)
    out = []
    for (index, group), q in sorted(sums.items()):
        charge = book.charges[index]
        exact = price_quantity(charge, q)
        out.append((line_id(book, usage.customer_id, charge.stable_key, group, usage.period_start, usage.period_end),
                    str(q), str(precise(exact)), str(book.money.round(exact))))
    return out


huge = st.integers(0, 10**38 - 1)  # up to NUMERIC(38, 12)'s integer digits: products past 80 digits


@settings(max_examples=examples(150), deadline=None)
@given(books(), st.lists(st.tuples(st.sampled_from(METERS), st.sampled_from(MODELS), st.one_of(st.integers(0, 5 * 10**7), huge)), max_size=8))
def test_rate_matches_the_plain_reference(book, rows):
    u = make(rows, T0, T2)
    got = [(x.line_id, str(x.quantity), str(x.precise_amount), str(x.amount)) for x in rate(book, u).lines if x.kind == "usage"]
    assert got == _reference_lines(book, u)
    assert got == [(x.line_id, str(x.quantity), str(x.precise_amount), str(x.amount)) for x in rate(book, u).lines if x.kind == "usage"]
