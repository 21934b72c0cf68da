"""The fitted predictors in PostgreSQL (`prediction_fits`): fit, save, read the one in force.

- `fit(conn, start, end, now=..., trigger=...)`: learn from the metered history of [start, end) and
  save it as the next version; returns its `FitInfo`.
- `latest(conn)` -> `Fitted | None`: the newest fit, its state loaded (`Fitted.requests` is the
  `prediction.RequestModel` whose `predict_request` the gateway calls).
- `status(conn)` -> dict: what is fitted, from which window, when, how many rows, and the fits before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.types.json import Jsonb

from infermeter.times import Window, utc_text
from prediction.request import RequestModel, fit_requests
from prediction.tasks import TaskModel, fit_tasks
from prediction_service import history

TRIGGERS = ("cli", "schedule", "api")


class NotFitted(LookupError):
    """No fit yet: `infermeter predict fit` makes one."""

    def __init__(self) -> None:
        super().__init__("no predictors fitted yet: run `infermeter predict fit` (or wait for `infermeter up`'s "
                         "schedule, INFERMETER_PREDICT_REFIT_INTERVAL_S)")


@dataclass(frozen=True)
class FitInfo:
    version: int
    window_start: datetime
    window_end: datetime
    fitted_at: datetime
    requests: int
    tasks: int
    fit_cpu_ms: int
    trigger: str

    def to_json(self) -> dict:
        return {"version": self.version, "window": {"from": utc_text(self.window_start), "to": utc_text(self.window_end)},
                "fitted_at": utc_text(self.fitted_at), "requests": self.requests, "tasks": self.tasks,
                "fit_cpu_ms": self.fit_cpu_ms, "trigger": self.trigger}


@dataclass(frozen=True)
class Fitted:
    info: FitInfo
    requests: RequestModel
    tasks: TaskModel


def fit(conn: psycopg.Connection, start: datetime, end: datetime, *, now: datetime, trigger: str = "cli") -> FitInfo:
    """Fit on [start, end) of metered history and save the result as the next version (one transaction)."""
    window = Window(start, end)
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {', '.join(TRIGGERS)}")
    cpu = time.process_time()
    observations = history.requests(conn, window.start, window.end)
    request_model = fit_requests(observations)
    task_model = fit_tasks(history.tasks(conn, observations, window.start, window.end))
    state = {"requests": request_model.to_state(), "tasks": task_model.to_state()}
    cpu_ms = round((time.process_time() - cpu) * 1000)
    with conn.transaction():
        version = conn.execute(
            "INSERT INTO prediction_fits (window_start, window_end, fitted_at, requests, tasks, fit_cpu_ms, trigger, "
            "state) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING version",
            (window.start, window.end, now, len(observations), task_model.tasks, cpu_ms, trigger, Jsonb(state)),
        ).fetchone()[0]
    return FitInfo(version, window.start, window.end, now, len(observations), task_model.tasks, cpu_ms, trigger)


_INFO = "version, window_start, window_end, fitted_at, requests, tasks, fit_cpu_ms, trigger"


def latest(conn: psycopg.Connection) -> Fitted | None:
    row = conn.execute(f"SELECT {_INFO}, state FROM prediction_fits ORDER BY version DESC LIMIT 1").fetchone()
    if row is None:
        return None
    state = row[-1]
    return Fitted(FitInfo(*row[:-1]), RequestModel.from_state(state["requests"]), TaskModel.from_state(state["tasks"]))


def require_latest(conn: psycopg.Connection) -> Fitted:
    fitted = latest(conn)
    if fitted is None:
        raise NotFitted()
    return fitted


def status(conn: psycopg.Connection, *, history_limit: int = 10) -> dict:
    """What is in force (the newest fit: its window, when, rows, cells, models and customers) and the
    fits before it."""
    rows = conn.execute(f"SELECT {_INFO} FROM prediction_fits ORDER BY version DESC LIMIT %s",
                        (history_limit,)).fetchall()
    if not rows:
        return {"fitted": False, "message": str(NotFitted()), "fits": []}
    current = latest(conn)
    return {"fitted": True, **current.info.to_json(),
            "request_cells": current.requests.cells, "models": current.requests.models(),
            "customers": len(current.requests.customers()),
            "fits": [FitInfo(*r).to_json() for r in rows]}
