"""Per task, per customer x model: how likely a task succeeds, how many attempts a successful one
takes, and a sample of tasks from which the cost per successful task is drawn under any price book
(`prediction.quotes.cost_per_successful_task`).

A task is what metering recorded under one task id: its requests with their attempt numbers, their
tokens, and its outcome (succeeded, failed, abandoned, or none yet). Its model is the model of its
first request. Cells: (customer, model), then (model), then global; a prediction reads the finest
cell with MIN_TASKS finished tasks. Each cell keeps up to SAMPLE_TASKS tasks (a seeded reservoir, so
a fit of the same rows keeps the same sample).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

FORMAT = 1
MIN_TASKS = 20
SAMPLE_TASKS = 200
OUTCOMES = ("succeeded", "failed", "abandoned")
LEVELS = ("customer_model", "model", "global")


@dataclass(frozen=True, slots=True)
class TaskObservation:
    """One task as metering recorded it (`outcome` None: no outcome reported yet)."""

    customer_id: str
    task_id: str
    model: str
    outcome: str | None
    attempts: int
    requests: int
    first_attempt_requests: int
    uncached_input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    first_request_at: datetime


@dataclass(frozen=True, slots=True)
class TaskSample:
    """A finished task kept in a cell's sample: what a simulation replays."""

    outcome: str
    attempts: int
    requests: int
    first_attempt_requests: int
    uncached_input_tokens: int
    cached_input_tokens: int
    output_tokens: int

    @property
    def request_overhead(self) -> float:
        """Requests per request of the first attempt (1.0: no retries)."""
        return self.requests / self.first_attempt_requests if self.first_attempt_requests else 1.0


@dataclass(frozen=True)
class TaskCell:
    """What a cell knows: finished tasks by outcome, attempts of the successful ones, a sample."""

    tasks: int
    outcomes: Mapping[str, int]
    attempts_of_successes: Mapping[int, int]
    first_attempt_requests: Mapping[int, int]
    sample: tuple[TaskSample, ...]
    basis: str = "global"

    @property
    def success_probability(self) -> float:
        return self.outcomes.get("succeeded", 0) / self.tasks if self.tasks else 0.0

    def attempts_until_success(self) -> dict[str, Any]:
        """The distribution of attempts of successful tasks: mean, p50, p90 and the histogram."""
        total = sum(self.attempts_of_successes.values())
        if not total:
            return {"tasks": 0, "mean": None, "p50": None, "p90": None, "histogram": {}}
        ordered = sorted(self.attempts_of_successes.items())
        mean = sum(k * n for k, n in ordered) / total

        def quantile(q: float) -> int:
            seen = 0
            for k, n in ordered:
                seen += n
                if seen >= q * total:
                    return k
            return ordered[-1][0]

        return {"tasks": total, "mean": round(mean, 4), "p50": quantile(0.5), "p90": quantile(0.9),
                "histogram": {str(k): n for k, n in ordered}}

    def typical_steps(self) -> int:
        """The median number of requests in a task's first attempt (1 without tasks)."""
        total = sum(self.first_attempt_requests.values())
        seen = 0
        for k, n in sorted(self.first_attempt_requests.items()):
            seen += n
            if seen * 2 >= total:
                return k
        return 1

    def to_json(self) -> dict[str, Any]:
        return {"basis": self.basis, "tasks": self.tasks, "outcomes": dict(self.outcomes),
                "success_probability": round(self.success_probability, 6),
                "attempts_until_success": self.attempts_until_success(), "typical_steps": self.typical_steps()}


EMPTY = TaskCell(0, {}, {}, {}, (), "none")


class _Builder:
    def __init__(self, seed: str, basis: str) -> None:
        self.basis = basis
        self.tasks = 0
        self.outcomes: Counter[str] = Counter()
        self.attempts: Counter[int] = Counter()
        self.steps: Counter[int] = Counter()
        self.sample: list[TaskSample] = []
        self.rng = random.Random(seed)

    def add(self, t: TaskObservation) -> None:
        if t.outcome not in OUTCOMES:
            return
        self.tasks += 1
        self.outcomes[t.outcome] += 1
        if t.outcome == "succeeded":
            self.attempts[t.attempts] += 1
        self.steps[max(1, t.first_attempt_requests)] += 1
        kept = TaskSample(t.outcome, t.attempts, t.requests, t.first_attempt_requests, t.uncached_input_tokens,
                          t.cached_input_tokens, t.output_tokens)
        if len(self.sample) < SAMPLE_TASKS:
            self.sample.append(kept)
        else:  # reservoir: every task of the cell kept with the same chance
            slot = self.rng.randrange(self.tasks)
            if slot < SAMPLE_TASKS:
                self.sample[slot] = kept

    def cell(self) -> TaskCell:
        return TaskCell(self.tasks, dict(self.outcomes), dict(self.attempts), dict(self.steps), tuple(self.sample),
                        self.basis)


class TaskModel:
    """The per-task cells of a fit; `predict_task(customer, model)` reads the finest with MIN_TASKS."""

    def __init__(self, cells: Mapping[tuple, TaskCell]) -> None:
        self._cells = dict(cells)

    @property
    def tasks(self) -> int:
        cell = self._cells.get(("g",))
        return cell.tasks if cell else 0

    def predict_task(self, customer_id: str, model: str) -> TaskCell:
        for key in (("c", customer_id, model), ("m", model), ("g",)):
            cell = self._cells.get(key)
            if cell is not None and cell.tasks >= MIN_TASKS:
                return cell
        cell = self._cells.get(("g",))
        return cell if cell is not None and cell.tasks else EMPTY

    def by_customer_model(self) -> list[tuple[str, str, TaskCell]]:
        return sorted((k[1], k[2], c) for k, c in self._cells.items() if k[0] == "c")

    def to_state(self) -> dict[str, Any]:
        def cell(c: TaskCell) -> dict[str, Any]:
            return {"tasks": c.tasks, "outcomes": dict(c.outcomes),
                    "attempts": {str(k): n for k, n in c.attempts_of_successes.items()},
                    "steps": {str(k): n for k, n in c.first_attempt_requests.items()},
                    "sample": [[s.outcome, s.attempts, s.requests, s.first_attempt_requests, s.uncached_input_tokens,
                                s.cached_input_tokens, s.output_tokens] for s in c.sample], "basis": c.basis}

        return {"format": FORMAT, "cells": [[list(k), cell(c)] for k, c in sorted(self._cells.items())]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> TaskModel:
        if state.get("format") != FORMAT:
            raise ValueError(f"task model state format {state.get('format')!r} is not {FORMAT}: refit "
                             "(`infermeter predict fit`)")
        cells = {}
        for key, c in state["cells"]:
            cells[tuple(key)] = TaskCell(
                int(c["tasks"]), {k: int(v) for k, v in c["outcomes"].items()},
                {int(k): int(v) for k, v in c["attempts"].items()}, {int(k): int(v) for k, v in c["steps"].items()},
                tuple(TaskSample(s[0], *(int(v) for v in s[1:])) for s in c["sample"]), c["basis"])
        return cls(cells)


def fit_tasks(tasks: Iterable[TaskObservation]) -> TaskModel:
    """The task cells of a window's tasks (in first-request order, then task id: a fixed order)."""
    builders: dict[tuple, _Builder] = {}
    for t in sorted(tasks, key=lambda t: (t.first_request_at, t.customer_id, t.task_id)):
        for key, basis in ((("c", t.customer_id, t.model), LEVELS[0]), (("m", t.model), LEVELS[1]),
                           (("g",), LEVELS[2])):
            builder = builders.get(key)
            if builder is None:
                builder = builders[key] = _Builder("/".join(key), basis)
            builder.add(t)
    return TaskModel({k: b.cell() for k, b in builders.items() if b.tasks})
