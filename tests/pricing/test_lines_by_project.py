"""Invoice lines by project (a book's `invoice: {group_by: project}`), pure: the largest-remainder split
at its edges, and `rate` splitting each request-meter line over its projects so that the project lines
add up to the ungrouped line exactly, while a book without the option rates as it always did."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pricing.book import PriceBookError, parse_price_book, price_book_from_data, price_book_to_data
from pricing.money import QUANT
from pricing.rating import Rating, line_id, rate
from pricing.split import split_by_quantity
from pricing.usage import Usage, UsageKey
from tests.examples import examples
from tests.pricing.test_properties import METERS, MODELS, books
from tests.pricing.test_properties import key as prop_key

D = Decimal
CENT = D("0.01")
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)

BOOK = """\
id: projects-2026-11
currency: USD
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "2.00", per: 1000000}
  - meter: cached_input_tokens
    free: 100
    price: {type: tiered_graduated, per: 1000000, tiers: [{up_to: 1000000, amount: "1.00"}, {up_to: null, amount: "0.50", flat_amount: "0.07"}]}
  - meter: output_tokens
    price: {type: tiered_volume, per: 1000000, tiers: [{up_to: 1000, amount: "9.00"}, {up_to: null, amount: "8.00"}]}
  - meter: output_tokens
    model: big
    price: {type: package, amount: "0.10", per: 1000}
  - meter: requests
    price: {type: flat, amount: "5.00"}
  - meter: successful_tasks
    price: {type: unit, amount: "0.05", per: 1}
  - meter: gpu_seconds
    price: {type: unit, amount: "3.60", per: 3600}
minimum: "100.00"
credits: "1.00"
"""
GROUPED = BOOK + "invoice:\n  group_by: project\n"


# ---------------------------------------------------------------- the split


@pytest.mark.parametrize(("whole", "quantities", "quantum", "expected"), [
    # one cent over three equal projects: the tie goes to the first in name order ('' first)
    (D("0.01"), {"web": 1, "batch": 1, "": 1}, CENT, {"": D("0.01"), "batch": D("0.00"), "web": D("0.00")}),
    (D("0.02"), {"web": 1, "batch": 1, "": 1}, CENT, {"": D("0.01"), "batch": D("0.01"), "web": D("0.00")}),
    # exact shares: no remainder to hand out
    (D("3.00"), {"a": 1, "b": 2}, CENT, {"a": D("1.00"), "b": D("2.00")}),
    # the largest remainder wins the cent left over, not the largest quantity: 4.00 over 1234567 / 765433 / 1
    (D("4.00"), {"web": 1_234_567, "batch": 765_433, "": 1}, CENT, {"web": D("2.47"), "batch": D("1.53"), "": D("0.00")}),
    # a project without quantity gets nothing, even when cents are left over
    (D("0.05"), {"a": 1, "b": 1, "zero": 0}, CENT, {"a": D("0.03"), "b": D("0.02"), "zero": D("0.00")}),
    # one project: the whole
    (D("12.34"), {"only": 7}, CENT, {"only": D("12.34")}),
    (D("0"), {"a": 1, "b": 3}, CENT, {"a": D("0.00"), "b": D("0.00")}),
    # every quantity zero: the whole to the first in name order
    (D("0.03"), {"b": 0, "a": 0}, CENT, {"a": D("0.03"), "b": D("0.00")}),
    # decimal quantities, yen (no minor unit), and the precise scale
    (D("10"), {"a": D("0.5"), "b": D("1.25")}, D(1), {"a": D("3"), "b": D("7")}),
    (D("0.000000000001"), {"a": 1, "b": 1}, QUANT, {"a": D("0.000000000001"), "b": D("0E-12")}),
    # a negative whole (an adjustment's difference) splits the same way, mirrored
    (D("-0.01"), {"a": 1, "b": 1}, CENT, {"a": D("0.00"), "b": D("-0.01")}),
])
def test_split_by_quantity_adds_up_to_the_whole_by_largest_remainder(whole, quantities, quantum, expected):
    parts = split_by_quantity(whole, quantities, quantum)
    assert parts == expected
    assert list(parts) == sorted(quantities)
    assert sum(parts.values(), D(0)) == whole
    assert all(p.as_tuple().exponent == quantum.as_tuple().exponent for p in parts.values())


def test_split_by_quantity_refuses_what_it_cannot_share():
    with pytest.raises(ValueError, match="not a multiple"):
        split_by_quantity(D("0.005"), {"a": 1}, CENT)
    with pytest.raises(ValueError, match="non-negative"):
        split_by_quantity(D("1.00"), {"a": 1, "b": -1}, CENT)
    with pytest.raises(ValueError, match="nothing to split"):
        split_by_quantity(D("1.00"), {}, CENT)
    assert split_by_quantity(D("0.00"), {}, CENT) == {}


# ---------------------------------------------------------------- the book option


def test_the_option_is_parsed_validated_and_absent_by_default():
    assert parse_price_book(BOOK).invoice is None and not parse_price_book(BOOK).lines_by_project
    assert parse_price_book(GROUPED).lines_by_project
    assert "invoice" not in price_book_to_data(parse_price_book(BOOK))  # the stored document as before
    data = price_book_to_data(parse_price_book(GROUPED))
    assert data["invoice"] == {"group_by": "project"}
    with pytest.raises(PriceBookError, match=r"invoice\.group_by"):
        parse_price_book(BOOK + "invoice:\n  group_by: model\n")
    with pytest.raises(PriceBookError, match=r"invoice\.split: unknown field"):
        parse_price_book(BOOK + "invoice:\n  split: project\n")


# ---------------------------------------------------------------- rating


def month(project_usage: dict[tuple[str, str, str], int], **others: int) -> Usage:
    """(meter, model, project) -> quantity of request meters, plus tasks and GPU time."""
    quantities = {UsageKey(meter, model, "d1", "", project): q for (meter, model, project), q in project_usage.items()}
    if others.get("tasks"):
        quantities[UsageKey("successful_tasks")] = others["tasks"]
    if others.get("gpu"):
        quantities[UsageKey("gpu_seconds", "", "d1", "H100")] = others["gpu"]
    return Usage("acme", START, END, quantities)


USAGE = month({
    ("uncached_input_tokens", "m1", "web"): 1_234_567, ("uncached_input_tokens", "m1", "batch"): 765_433,
    ("uncached_input_tokens", "m1", ""): 1,
    ("cached_input_tokens", "m1", "web"): 2_000_000, ("cached_input_tokens", "m1", ""): 333_333,
    ("output_tokens", "m1", "web"): 1, ("output_tokens", "m1", "batch"): 1, ("output_tokens", "m1", ""): 1_001,
    ("output_tokens", "big", "batch"): 1_500, ("output_tokens", "big", "web"): 1,
    ("requests", "m1", "web"): 3, ("requests", "m1", ""): 4, ("requests", "big", "batch"): 2,
}, tasks=7, gpu=1800)


def without_projects(usage: Usage) -> Usage:
    return Usage.build(usage.customer_id, usage.period_start, usage.period_end,
                       [(k._replace(project=""), q) for k, q in usage.quantities.items()])


def test_a_book_without_the_option_rates_usage_with_projects_as_if_it_had_none():
    book = parse_price_book(BOOK)
    assert rate(book, USAGE) == rate(book, without_projects(USAGE))
    assert {line.project for line in rate(book, USAGE).lines} == {""}


def test_each_request_line_is_split_over_its_projects_and_adds_up_to_the_ungrouped_line_exactly():
    whole = rate(parse_price_book(BOOK), without_projects(USAGE))
    grouped_book = parse_price_book(GROUPED)
    grouped = rate(grouped_book, USAGE)
    assert rate(grouped_book, USAGE) == grouped  # deterministic
    assert grouped.total == whole.total and grouped.usage_total == whole.usage_total
    by_line: dict[tuple[str, str], list] = {}
    for line in grouped.lines:
        by_line.setdefault((line.charge_key, line.group), []).append(line)
    assert set(by_line) == {(line.charge_key, line.group) for line in whole.lines}
    for line in whole.lines:
        parts = by_line[(line.charge_key, line.group)]
        assert sum((p.amount for p in parts), D(0)) == line.amount
        assert sum((p.precise_amount for p in parts), D(0)) == line.precise_amount
        assert sum((p.quantity for p in parts), D(0)) == line.quantity
        assert all(p.unit_price == line.unit_price and p.kind == line.kind and p.meter == line.meter for p in parts)
    ids = [line.line_id for line in grouped.lines]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & {line.line_id for line in whole.lines if line.meter in ("uncached_input_tokens",
                                                                                  "cached_input_tokens", "output_tokens")}

    def amounts(charge_key: str, group: str) -> dict[str, D]:
        return {p.project: p.amount for p in by_line[(charge_key, group)]}

    # unit: 4.000002 -> 4.00, shared 2.47 / 1.53 / 0.00 (the largest remainder, web's .913, takes the cent)
    assert amounts("uncached_input_tokens", "m1") == {"": D("0.00"), "batch": D("1.53"), "web": D("2.47")}
    # graduated tiers with a free allowance: the line's amount (of the summed quantity) shared by quantity
    cached = next(line for line in whole.lines if line.charge_key == "cached_input_tokens")
    assert cached.amount == D("1.74")  # 2,333,333 - 100 free: 1,000,000 x 1.00 + 1,333,233 x 0.50 per 1M + 0.07
    # 174 cents by 2,000,000 : 333,333 -> 149.14 / 24.86: the cent left over to '' (remainder .86)
    assert amounts("cached_input_tokens", "m1") == {"": D("0.25"), "web": D("1.49")}
    # volume tiers: 1,003 tokens fall in the 8.00 tier for all of them (0.008024 -> 0.01): the cent to ''
    assert amounts("output_tokens", "m1") == {"": D("0.01"), "batch": D("0.00"), "web": D("0.00")}
    # package: 2 packages of 1,000 started = 0.20, by quantity 1,500 : 1
    assert amounts("output_tokens;model=big", "big") == {"batch": D("0.20"), "web": D("0.00")}
    # kept whole, without a project and with the ungrouped line's id: flat, tasks, GPU time, minimum, credits
    kept = [line for line in grouped.lines if line.charge_key in ("requests", "successful_tasks", "gpu_seconds")
            or line.kind != "usage"]
    assert kept == [line for line in whole.lines if line.charge_key in ("requests", "successful_tasks", "gpu_seconds")
                    or line.kind != "usage"]
    assert {line.charge_key for line in kept} == {"requests", "successful_tasks", "gpu_seconds", "minimum", "credits"}
    assert all(line.project == "" for line in kept)


def test_project_line_ids_are_the_whole_lines_text_and_the_project():
    book = parse_price_book(GROUPED)
    grouped = rate(book, USAGE)
    for line in grouped.lines:
        if line.meter in ("uncached_input_tokens", "cached_input_tokens", "output_tokens"):
            assert line.line_id == line_id(book, "acme", line.charge_key, line.group, START, END, line.project)
            assert line.line_id != line_id(book, "acme", line.charge_key, line.group, START, END)
        else:
            assert line.line_id == line_id(book, "acme", line.charge_key, line.group, START, END)
    # the same project's line keeps its id when the others' usage changes
    more = Usage(USAGE.customer_id, START, END,
                 {**USAGE.quantities, UsageKey("uncached_input_tokens", "m1", "d1", "", "new"): 10})
    before = {(line.charge_key, line.group, line.project): line.line_id for line in grouped.lines}
    after = {(line.charge_key, line.group, line.project): line.line_id for line in rate(book, more).lines}
    assert {k: v for k, v in after.items() if k in before} == before


def test_one_cent_over_three_projects_and_a_single_project():
    book = parse_price_book(GROUPED.replace('amount: "2.00", per: 1000000', 'amount: "0.01", per: 3'))
    three = rate(book, month({("uncached_input_tokens", "m1", p): 1 for p in ("web", "batch", "")}))
    usage_lines = [line for line in three.lines if line.kind == "usage"]
    assert [(line.project, line.amount) for line in usage_lines] == [("", D("0.01")), ("batch", D("0.00")),
                                                                     ("web", D("0.00"))]
    assert [line.precise_amount for line in usage_lines] == [D("0.003333333334"), D("0.003333333333"),
                                                             D("0.003333333333")]
    one = rate(book, month({("uncached_input_tokens", "m1", "web"): 3}))
    [line] = [line for line in one.lines if line.kind == "usage"]
    assert (line.project, line.quantity, line.amount, line.precise_amount) == ("web", D(3), D("0.01"), D("0.01"))


def test_a_rating_of_no_usage_under_a_grouped_book_is_the_minimum_alone():
    rating = rate(parse_price_book(GROUPED), Usage("acme", START, END, {}))
    assert isinstance(rating, Rating)
    assert [(line.kind, line.amount) for line in rating.lines] == [("minimum", D("100.00")), ("credit", D("-1.00"))]


# ---------------------------------------------------------------- properties

PROJECTS = ["", "web", "batch"]
project_rows = st.lists(st.tuples(st.sampled_from(METERS), st.sampled_from(MODELS), st.sampled_from(PROJECTS),
                                  st.integers(0, 5 * 10**7)), max_size=10)


def _key(meter: str, model: str, project: str) -> UsageKey:
    found = prop_key(meter, model)
    return found._replace(project=project) if meter in ("uncached_input_tokens", "output_tokens") else found


@settings(max_examples=examples(150), deadline=None)
@given(books(), project_rows)
def test_grouping_by_project_never_changes_a_lines_amount_only_shares_it(book, rows):
    """Any book and usage: the grouped rating's lines, summed per (charge, model), are the ungrouped
    rating's, precise and rounded; each project line is within one minor unit of its exact share."""
    grouped_book = price_book_from_data({**price_book_to_data(book), "invoice": {"group_by": "project"}}, "grouped")
    usage = Usage.build("c", START, END, [(_key(m, mod, p), D(q)) for m, mod, p, q in rows])
    whole = rate(book, without_projects(usage))
    assert rate(book, usage) == whole
    grouped = rate(grouped_book, usage)
    assert grouped.total == whole.total
    sums: dict[tuple[str, str, str], list[D]] = {}
    for line in grouped.lines:
        s = sums.setdefault((line.kind, line.charge_key, line.group), [D(0), D(0), D(0)])
        s[0] += line.quantity
        s[1] += line.precise_amount
        s[2] += line.amount
    assert sums == {(x.kind, x.charge_key, x.group): [x.quantity, x.precise_amount, x.amount] for x in whole.lines}
    minor = book.money.minor_unit
    for line in grouped.lines:
        if line.project or (line.kind == "usage" and line.line_id not in {x.line_id for x in whole.lines}):
            [parent] = [x for x in whole.lines if (x.charge_key, x.group) == (line.charge_key, line.group)]
            exact = parent.amount * line.quantity / parent.quantity
            assert abs(line.amount - exact) < minor
    assert len({line.line_id for line in grouped.lines}) == len(grouped.lines)
