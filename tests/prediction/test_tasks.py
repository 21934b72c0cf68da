"""Per-task cells: success, attempts until success, the kept sample, fallbacks, the stored state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from prediction.tasks import EMPTY, MIN_TASKS, SAMPLE_TASKS, TaskModel, TaskObservation, fit_tasks

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def task(i: int, *, customer: str = "c1", model: str = "m1", outcome: str | None = "succeeded", attempts: int = 1,
         requests: int = 2, first: int = 2) -> TaskObservation:
    return TaskObservation(customer, f"t-{i}", model, outcome, attempts, requests, first, 1000 * requests,
                           100 * requests, 50 * requests, T0 + timedelta(minutes=i))


def test_success_attempts_and_steps_per_customer_model():
    tasks = [task(i) for i in range(16)] + [task(100 + i, attempts=2, requests=3) for i in range(4)]
    tasks += [task(200 + i, outcome="failed", attempts=3) for i in range(5)] + [task(300, outcome=None)]
    cell = fit_tasks(tasks).predict_task("c1", "m1")
    assert (cell.basis, cell.tasks) == ("customer_model", 25)
    assert cell.success_probability == 20 / 25
    assert cell.attempts_until_success() == {"tasks": 20, "mean": 1.2, "p50": 1, "p90": 2,
                                             "histogram": {"1": 16, "2": 4}}
    assert cell.typical_steps() == 2
    assert len(cell.sample) == 25  # the task without an outcome is not learned


def test_fallback_to_model_then_global_below_min_tasks():
    tasks = [task(i, customer="big") for i in range(MIN_TASKS)] + [task(100, customer="small", outcome="failed")]
    model = fit_tasks(tasks)
    assert model.predict_task("small", "m1").basis == "model"
    assert model.predict_task("small", "other").basis == "global"
    assert model.predict_task("big", "m1").basis == "customer_model"
    assert fit_tasks([]).predict_task("x", "y") is EMPTY


def test_the_sample_is_a_bounded_seeded_reservoir_and_round_trips():
    tasks = [task(i, requests=1 + i % 7, first=1) for i in range(3 * SAMPLE_TASKS)]
    a, b = fit_tasks(tasks), fit_tasks(list(reversed(tasks)))
    cell = a.predict_task("c1", "m1")
    assert len(cell.sample) == SAMPLE_TASKS and cell.tasks == 3 * SAMPLE_TASKS
    assert cell.sample == b.predict_task("c1", "m1").sample  # fitted in first-request order, whatever the input order
    restored = TaskModel.from_state(json.loads(json.dumps(a.to_state())))
    assert restored.predict_task("c1", "m1") == cell
