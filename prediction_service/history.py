"""Metered history as the predictors read it: metering's rows (`metering.history_reads`) made into
`prediction.request.RequestObservation` and `prediction.tasks.TaskObservation`.

A task is made of the window's request events that carry its id (rejected ones left out: they never
ran), with the latest outcome metering has for it reported before the window's end (none: still
open, or its outcome came later). Its model is its first request's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

import psycopg

from metering import history_reads
from prediction.request import NOT_LEARNED_STATUSES, RequestObservation
from prediction.tasks import TaskObservation


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request event with the prediction its producer recorded at admission (None: not recorded)."""

    request: RequestObservation
    prediction: dict | None


def recorded_requests(conn: psycopg.Connection, start: datetime, end: datetime, *,
                      customer_id: str | None = None) -> Iterator[RecordedRequest]:
    for (source, event_id, customer, model, status, inp, cached, out, started, finished, task_id, attempt,
         max_tokens, prefix_seen, prediction) in history_reads.request_rows(conn, start, end, customer_id=customer_id):
        yield RecordedRequest(RequestObservation(source, event_id, customer, model, status, inp, cached, out,
                                                 started or finished, finished, task_id, attempt, max_tokens,
                                                 prefix_seen), prediction)


def requests(conn: psycopg.Connection, start: datetime, end: datetime) -> list[RequestObservation]:
    """The request events of [start, end), in event-time order."""
    return [r.request for r in recorded_requests(conn, start, end)]


def tasks_of(observations: Iterable[RequestObservation], outcomes: dict[tuple[str, str], str]) -> list[TaskObservation]:
    """The tasks of these requests (see the module doc); `outcomes` maps (customer, task) to its outcome."""
    tasks: dict[tuple[str, str], list[RequestObservation]] = {}
    for r in observations:
        if r.task_id is not None and r.status not in NOT_LEARNED_STATUSES:
            tasks.setdefault((r.customer_id, r.task_id), []).append(r)
    out = []
    for (customer, task_id), rows in tasks.items():
        first = min(rows, key=lambda r: (r.started_at, r.source, r.event_id))
        out.append(TaskObservation(
            customer, task_id, first.model, outcomes.get((customer, task_id)), max(r.attempt for r in rows), len(rows),
            sum(1 for r in rows if r.attempt == 1), sum(r.input_tokens - r.cached_input_tokens for r in rows),
            sum(r.cached_input_tokens for r in rows), sum(r.output_tokens for r in rows), first.started_at))
    return out


def tasks(conn: psycopg.Connection, observations: Iterable[RequestObservation], start: datetime, end: datetime
          ) -> list[TaskObservation]:
    """The tasks of the window's requests, with the outcomes reported in [start, end)."""
    outcomes = {(c, t): o for c, t, o in history_reads.task_outcome_rows(conn, start, end)}
    return tasks_of(observations, outcomes)
