"""Pricing's time boundaries to the microsecond: a task outcome reported exactly at its deadline,
a billed outcome exactly at a window's start or end, usage periods that are empty or adjacent, the
cost model's hour filters and the experiments' day/hour buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pricing.cost import Attribution, CostKey
from pricing.experiments import experiment_buckets
from pricing.task_outcomes import OutcomeReport, TaskReports, billed_outcome, deadline, task_quantities
from pricing.usage import Usage, UsageKey
from tests.pricing.test_task_outcomes import VERIFIER, trust

D = Decimal
US = timedelta(microseconds=1)
H = timedelta(hours=1)
T0 = datetime(2026, 11, 2, 10, tzinfo=UTC)
DUE = T0 + 24 * H  # the book's task_timeout is 24h


def task(finished_at: datetime | None, outcome: str = "failed", first: datetime | None = T0) -> TaskReports:
    reports = () if finished_at is None else (OutcomeReport(VERIFIER, "e1", outcome, finished_at),)
    return TaskReports("acme", "t1", first, 2 if first else 0, reports)


# ---------------------------------------------------------------- a task's deadline


@pytest.mark.parametrize(
    ("finished_at", "billed"),
    [
        (DUE - US, ("failed", DUE - US, False)),  # the last microsecond before the deadline: believed
        (DUE, ("succeeded", DUE, True)),  # exactly at the deadline: too late, the rule decides
        (DUE + US, ("succeeded", DUE, True)),
        (T0, ("failed", T0, False)),  # at the first request itself
    ],
    ids=["one-us-before", "at-the-deadline", "one-us-after", "at-the-first-request"],
)
def test_a_trusted_outcome_counts_only_before_the_deadline(finished_at, billed):
    found = billed_outcome(task(finished_at), trust("bill_as_success"))
    assert (found.outcome, found.at, found.by_rule) == billed


def test_the_deadline_is_the_first_request_plus_the_timeout():
    assert deadline(task(None), trust()) == DUE
    assert deadline(task(None, first=None), trust()) is None


def test_of_two_trusted_outcomes_at_the_same_instant_the_later_source_then_event_wins():
    reports = (OutcomeReport(VERIFIER, "e2", "succeeded", T0 + H), OutcomeReport(VERIFIER, "e1", "failed", T0 + H),
               OutcomeReport(VERIFIER + "b", "e0", "abandoned", T0 + H))
    found = billed_outcome(TaskReports("acme", "t1", T0, 1, reports), trust())
    assert found.outcome == "abandoned"
    found = billed_outcome(TaskReports("acme", "t1", T0, 1, reports[:2]), trust())
    assert found.outcome == "succeeded"  # same source: event e2 after e1


# ---------------------------------------------------------------- windows [start, end)


@pytest.mark.parametrize(
    ("start", "end", "counted"),
    [
        (T0 + H, T0 + 2 * H, True),  # billed exactly at the window's start: in it
        (T0, T0 + H, False),  # billed exactly at the window's end: in the next one
        (T0, T0 + H + US, True),
        (T0 + H + US, T0 + 2 * H, False),
    ],
    ids=["at-start", "at-end", "one-us-before-end", "one-us-after-start"],
)
def test_a_task_counts_in_the_window_of_its_billed_instant(start, end, counted):
    quantities = task_quantities([task(T0 + H, "succeeded")], trust(), start, end)
    assert quantities == ({"acme": (1, 0, 2)} if counted else {})


def test_a_rule_billed_task_counts_at_its_deadline():
    assert task_quantities([task(None)], trust("bill_as_failure"), DUE, DUE + H) == {"acme": (0, 1, 2)}
    assert task_quantities([task(None)], trust("bill_as_failure"), DUE - H, DUE) == {}
    assert task_quantities([task(None)], trust("not_billed"), DUE, DUE + H) == {}


# ---------------------------------------------------------------- usage periods


def test_a_usage_period_may_be_empty_but_not_reversed():
    assert Usage("c", T0, T0).quantities == {}
    with pytest.raises(ValueError, match="is before its start"):
        Usage("c", T0, T0 - US)
    with pytest.raises(ValueError, match="timezone-aware"):
        Usage("c", datetime(2026, 11, 2), T0)


def test_usage_joins_only_adjacent_periods():
    a = Usage.build("c", T0, T0 + H, [(UsageKey("requests", "m"), 2)])
    b = Usage.build("c", T0 + H, T0 + 2 * H, [(UsageKey("requests", "m"), 3)])
    joined = a.then(b)
    assert (joined.period_start, joined.period_end, joined.total("requests")) == (T0, T0 + 2 * H, 5)
    with pytest.raises(ValueError, match="not adjacent"):
        a.then(Usage.build("c", T0 + H + US, T0 + 2 * H, []))
    with pytest.raises(ValueError, match="different customers"):
        a.then(Usage.build("d", T0 + H, T0 + 2 * H, []))


def test_a_zero_quantity_is_valid_and_a_negative_one_is_not():
    assert Usage("c", T0, T0 + H, {UsageKey("requests"): D(0)}).total("requests") == 0
    with pytest.raises(ValueError, match="negative"):
        Usage("c", T0, T0 + H, {UsageKey("requests"): D("-0.000000000001")})


# ---------------------------------------------------------------- the cost model's hours


def test_cost_by_hour_takes_the_start_hour_and_leaves_the_end_hour():
    att = Attribution()
    for i in range(3):
        att.cost[CostKey("a", "m", "d", "H100", T0 + i * H)] = D(10) ** i  # 1, 10, 100
    assert att.cost_by(start=T0 + H) == D(110)
    assert att.cost_by(end=T0 + H) == D(1)
    assert att.cost_by(start=T0 + H, end=T0 + 2 * H) == D(10)
    assert att.cost_by(start=T0 + H + US, end=T0 + 2 * H + US) == D(100)


# ---------------------------------------------------------------- experiment buckets


@pytest.mark.parametrize(
    ("length", "name", "count", "last"),
    [
        (2 * 24 * H, "day", 2, timedelta(days=1)),  # exactly two days: day buckets
        (2 * 24 * H - US, "hour", 48, H - US),  # one microsecond less: hours, the last one cut short
        (2 * 24 * H + US, "day", 3, US),
        (H, "hour", 1, H),
    ],
    ids=["two-days", "two-days-less-1us", "two-days-and-1us", "one-hour"],
)
def test_experiment_buckets_are_days_from_two_days_on(length, name, count, last):
    found, buckets = experiment_buckets(T0, T0 + length)
    assert (found, len(buckets)) == (name, count)
    assert buckets[0][0] == T0 and buckets[-1][1] == T0 + length
    assert buckets[-1][1] - buckets[-1][0] == last
    assert all(a[1] == b[0] for a, b in zip(buckets, buckets[1:], strict=False))


def test_a_customers_tasks_add_up_in_a_window():
    tasks = [TaskReports("acme", f"t{i}", T0, i, (OutcomeReport(VERIFIER, f"e{i}", outcome, T0 + H),))
             for i, outcome in enumerate(["succeeded", "succeeded", "failed", "failed", "failed"], start=1)]
    tasks.append(TaskReports("zeta", "z", T0, 7, (OutcomeReport(VERIFIER, "ez", "succeeded", T0 + H),)))
    assert task_quantities(tasks, trust(), T0, DUE) == {"acme": (2, 3, 1 + 2 + 3 + 4 + 5), "zeta": (1, 0, 7)}
