"""Trusted task outcomes (pure): which outcome a per-task book bills, and when; the book's fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pricing.book import PriceBookError, parse_price_book, price_book_from_data, price_book_to_data
from pricing.task_outcomes import (
    OutcomeReport,
    TaskReports,
    billed_outcome,
    task_quantities,
    tasks_from_rows,
)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)
BOOK = """
id: per-task-trusted
currency: USD
charges:
  - meter: successful_tasks
    price: {type: unit, amount: "0.20", per: 1}
task_outcomes:
  trusted_sources: ["//verifier/", "infermeter://gateway/"]
  task_timeout: 24h
  untrusted_outcome: RULE
"""
VERIFIER, GATEWAY, CUSTOMER = "//verifier/checks", "infermeter://gateway/gw-1", "//customer/acme"


def trust(rule: str = "bill_as_success"):
    return parse_price_book(BOOK.replace("RULE", rule)).task_outcomes


def task(*reports: tuple[str, str, datetime], first: datetime | None = T0, attempts: int = 1) -> TaskReports:
    return TaskReports("acme", "t1", first, attempts if first else 0,
                       tuple(OutcomeReport(s, f"e{i}", o, at) for i, (s, o, at) in enumerate(reports)))


@pytest.mark.parametrize(
    "reports, rule, expected",
    [
        # the customer marks its task failed: not believed; no trusted outcome -> the rule at the deadline
        ([(CUSTOMER, "failed", T0 + H)], "bill_as_success", ("succeeded", T0 + 24 * H, True)),
        ([(CUSTOMER, "failed", T0 + H)], "bill_as_failure", ("failed", T0 + 24 * H, True)),
        ([(CUSTOMER, "succeeded", T0 + H)], "not_billed", None),
        ([], "bill_as_success", ("succeeded", T0 + 24 * H, True)),
        # a trusted verifier's outcome counts at its finished_at, whatever the customer says later
        ([(VERIFIER, "succeeded", T0 + H), (CUSTOMER, "failed", T0 + 2 * H)], "bill_as_failure",
         ("succeeded", T0 + H, False)),
        ([(VERIFIER, "failed", T0 + H)], "bill_as_success", ("failed", T0 + H, False)),
        # the latest trusted outcome before the deadline wins
        ([(GATEWAY, "failed", T0 + H), (VERIFIER, "succeeded", T0 + 3 * H)], "not_billed",
         ("succeeded", T0 + 3 * H, False)),
        # a trusted outcome at or after the deadline is too late: the rule decides
        ([(VERIFIER, "succeeded", T0 + 24 * H)], "bill_as_failure", ("failed", T0 + 24 * H, True)),
        ([(VERIFIER, "failed", T0 + 2 * H), (VERIFIER, "succeeded", T0 + 30 * H)], "bill_as_success",
         ("failed", T0 + 2 * H, False)),
        # a prefix is a prefix: '//verifier/' does not trust '//verifier-of-acme'
        ([("//verifier-of-acme", "failed", T0 + H)], "bill_as_success", ("succeeded", T0 + 24 * H, True)),
    ],
)
def test_the_billed_outcome(reports, rule, expected):
    billed = billed_outcome(task(*reports), trust(rule))
    assert (None if billed is None else (billed.outcome, billed.at, billed.by_rule)) == expected


def test_a_task_without_attempts_is_billed_only_on_a_trusted_outcome():
    assert billed_outcome(task((CUSTOMER, "succeeded", T0), first=None), trust()) is None
    billed = billed_outcome(task((VERIFIER, "succeeded", T0 + 100 * H), first=None), trust())
    assert (billed.outcome, billed.at) == ("succeeded", T0 + 100 * H)  # no attempts: no deadline


def test_quantities_count_tasks_in_the_window_of_their_billed_time_with_their_attempts():
    tasks = [
        TaskReports("acme", "a", T0, 3, (OutcomeReport(CUSTOMER, "e1", "failed", T0 + H),)),  # rule: day after
        TaskReports("acme", "b", T0, 2, (OutcomeReport(VERIFIER, "e2", "failed", T0 + H),)),
        TaskReports("acme", "c", T0, 1, (OutcomeReport(VERIFIER, "e3", "abandoned", T0 + H),)),
        TaskReports("zeta", "d", T0 - 20 * H, 4, ()),  # deadline T0 + 4h
    ]
    book_trust = trust("bill_as_success")
    assert task_quantities(tasks, book_trust, T0, T0 + 24 * H) == {"acme": (0, 1, 2), "zeta": (1, 0, 4)}
    assert task_quantities(tasks, book_trust, T0 + 24 * H, T0 + 48 * H) == {"acme": (1, 0, 3)}
    # every task lands in exactly one window
    split = [task_quantities(tasks, book_trust, T0 + i * 6 * H, T0 + (i + 1) * 6 * H) for i in range(8)]
    totals = {}
    for part in split:
        for customer, q in part.items():
            totals[customer] = tuple(a + b for a, b in zip(totals.get(customer, (0, 0, 0)), q, strict=True))
    assert totals == {"acme": (1, 1, 5), "zeta": (1, 0, 4)}


def test_rows_become_tasks():
    rows = [("acme", "a", T0, 2, CUSTOMER, "e1", "failed", T0 + H), ("acme", "a", T0, 2, VERIFIER, "e2", "succeeded", T0),
            ("acme", "b", T0, 1, None, None, None, None)]
    a, b = tasks_from_rows(rows)
    assert (a.task_id, a.attempts, [r.source for r in a.reports]) == ("a", 2, [CUSTOMER, VERIFIER])
    assert (b.task_id, b.reports) == ("b", ())


def test_the_book_fields_round_trip_and_bad_ones_are_named():
    book = parse_price_book(BOOK.replace("RULE", "not_billed"))
    assert book.task_outcomes.task_timeout == 86400
    assert price_book_from_data(price_book_to_data(book)) == book
    assert parse_price_book(BOOK.replace("RULE", "not_billed").replace("24h", "90m")).task_outcomes.task_timeout == 5400
    assert parse_price_book(BOOK.replace("RULE", "not_billed").replace("24h", "3600")).task_outcomes.task_timeout == 3600
    assert parse_price_book(BOOK.replace("untrusted_outcome: RULE", "untrusted_outcome: not_billed")).task_outcomes
    for text, where in [
        (BOOK.replace("RULE", "pay_nothing"), "task_outcomes.untrusted_outcome:"),
        (BOOK.replace("RULE", "not_billed").replace("24h", "soon"), "task_outcomes.task_timeout: 'soon' is not a duration"),
        (BOOK.replace("RULE", "not_billed").replace("24h", "0s"), "task_outcomes.task_timeout: a task timeout must be longer"),
        (BOOK.replace("RULE", "not_billed").replace('["//verifier/", "infermeter://gateway/"]', "[]"),
         "task_outcomes.trusted_sources:"),
        (BOOK.replace("  untrusted_outcome: RULE\n", ""), "task_outcomes.untrusted_outcome: required field is missing"),
        (BOOK.replace("RULE", "not_billed").replace("successful_tasks", "output_tokens"),
         "task_outcomes applies to the task meters"),
    ]:
        with pytest.raises(PriceBookError) as info:
            parse_price_book(text, "books/bad.yaml")
        assert where in str(info.value), str(info.value)


def test_a_book_without_task_outcomes_believes_every_outcome():
    book = parse_price_book(BOOK.split("task_outcomes:")[0])
    assert book.task_outcomes is None
