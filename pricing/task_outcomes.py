"""Trusted task outcomes: which outcome a book bills a task at, and when. Pure.

A per-task book must not take a customer's word that its tasks failed. `PriceBook.task_outcomes`
(`pricing.book.TaskOutcomeTrust`) names the sources it believes and what happens without them:

- a task's **deadline** is its first request plus `task_timeout`;
- it is billed at its latest outcome from a trusted source whose `finished_at` is before the
  deadline (ties broken by source, then event id: the order metering keeps its latest outcome in),
  counted at that `finished_at`;
- else, if it had attempts, `untrusted_outcome` decides, counted at the deadline:
  `bill_as_success` (a successful task), `bill_as_failure` (a failed task), `not_billed` (no task
  meter counts it, its attempts included);
- a task with no attempt and no trusted outcome is not billed.

The decision is a function of the stored reports only (not of the clock), so rating the same
reports again gives the same quantities. Outcomes reported after the deadline change nothing.
A book without `task_outcomes` believes every outcome, as metering's latest outcome per task.

The adapters read each candidate task's reports (`metering.period_reads.task_reports`) and hand them
here as plain rows; `task_quantities` counts what a window bills.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from pricing.book import TaskOutcomeTrust

RULE_OUTCOMES = {"bill_as_success": "succeeded", "bill_as_failure": "failed", "not_billed": None}


class OutcomeReport(NamedTuple):
    source: str
    event_id: str
    outcome: str  # succeeded | failed | abandoned
    finished_at: datetime


class TaskReports(NamedTuple):
    """One task: its first request (None: no attempt recorded), how many attempts it had, and every
    outcome reported for it, whoever reported it."""

    customer_id: str
    task_id: str
    first_request_at: datetime | None
    attempts: int
    reports: tuple[OutcomeReport, ...]


class BilledOutcome(NamedTuple):
    outcome: str  # succeeded | failed | abandoned
    at: datetime  # when it counts: the trusted outcome's finished_at, or the deadline
    by_rule: bool  # True when no trusted outcome came before the deadline


def deadline(task: TaskReports, trust: TaskOutcomeTrust) -> datetime | None:
    if task.first_request_at is None:
        return None
    return task.first_request_at + timedelta(seconds=trust.task_timeout)


def billed_outcome(task: TaskReports, trust: TaskOutcomeTrust) -> BilledOutcome | None:
    """The outcome the book bills `task` at and when, or None when it bills nothing for it."""
    return _billed(task, tuple(trust.trusted_sources), timedelta(seconds=trust.task_timeout),
                   RULE_OUTCOMES[trust.untrusted_outcome])


def _billed(task: TaskReports, prefixes: tuple[str, ...], timeout: timedelta, rule: str | None) -> BilledOutcome | None:
    due = None if task.first_request_at is None else task.first_request_at + timeout
    latest = None
    for r in task.reports:
        if r.source.startswith(prefixes) and (due is None or r.finished_at < due) and (
                latest is None or (r.finished_at, r.source, r.event_id) > (latest.finished_at, latest.source,
                                                                           latest.event_id)):
            latest = r
    if latest is not None:
        return BilledOutcome(latest.outcome, latest.finished_at, False)
    if due is None or rule is None:
        return None
    return BilledOutcome(rule, due, True)


def tasks_from_rows(rows: Iterable[tuple]) -> list[TaskReports]:
    """TaskReports from rows (customer, task, first_request_at, attempts, source, event_id, outcome,
    finished_at) in (customer, task) order, one row per report (source None: the task has none), as
    `metering.period_reads.task_reports` returns them."""
    out: list[TaskReports] = []
    current: tuple | None = None
    reports: list[OutcomeReport] = []

    def flush() -> None:
        if current is not None:
            out.append(TaskReports(*current, tuple(reports)))

    for customer, task, first_at, attempts, source, event_id, outcome, finished_at in rows:
        if current is None or current[:2] != (customer, task):
            flush()
            current, reports = (customer, task, first_at, int(attempts or 0)), []
        if source is not None:
            reports.append(OutcomeReport(source, event_id, outcome, finished_at))
    flush()
    return out


def task_quantities(
    tasks: Iterable[TaskReports], trust: TaskOutcomeTrust, start: datetime, end: datetime
) -> dict[str, tuple[int, int, int]]:
    """Per customer, (successful tasks, failed tasks, attempts of those tasks) billed in [start, end):
    the tasks whose billed outcome counts inside the window. Abandoned tasks count in neither meter
    and their attempts are not billed (as `metering.period_reads.task_totals` counts them)."""
    out: dict[str, tuple[int, int, int]] = {}
    prefixes, timeout = tuple(trust.trusted_sources), timedelta(seconds=trust.task_timeout)
    rule = RULE_OUTCOMES[trust.untrusted_outcome]
    for task in tasks:
        billed = _billed(task, prefixes, timeout, rule)
        if billed is None or not start <= billed.at < end or billed.outcome not in ("succeeded", "failed"):
            continue
        ok, failed, attempts = out.get(task.customer_id, (0, 0, 0))
        if billed.outcome == "succeeded":
            ok += 1
        else:
            failed += 1
        out[task.customer_id] = (ok, failed, attempts + task.attempts)
    return out
