"""The meter vocabulary: the names of the meters usage is rated by, defined here once.

A price book's charge names one of them (`pricing.book`); metering's reads name their quantities
after them (`metering.period_reads`, `metering.period_usage`, `metering.billing_reads`); billing,
the budgets, the experiments, the exports and the dashboards import them from here. Pure constants,
no import: every package of the project may import this module (pricing is the pure domain, below
metering, billing and serving alike).

- Request meters (per model, deployment and project of each request): `requests` and the three
  token meters. Uncached input is the request's input tokens minus its cached input tokens.
- Task meters (at the task's outcome time): successful and failed tasks, and the attempts of both
  (an abandoned task's attempts are billed by no meter). `abandoned_tasks` is counted in reports of
  usage (unbilled usage) but no charge may name it.
- `gpu_seconds`: GPU time (per deployment and GPU type), attributed by the cost model.
- `usage:<name>`: an infermeter.usage.v1 meter reported by a product (`usage_meter`).
"""

from __future__ import annotations

REQUESTS = "requests"
UNCACHED_INPUT_TOKENS = "uncached_input_tokens"
CACHED_INPUT_TOKENS = "cached_input_tokens"
OUTPUT_TOKENS = "output_tokens"
TOKEN_METERS = (UNCACHED_INPUT_TOKENS, CACHED_INPUT_TOKENS, OUTPUT_TOKENS)
REQUEST_METERS = (*TOKEN_METERS, REQUESTS)

SUCCESSFUL_TASKS = "successful_tasks"
FAILED_TASKS = "failed_tasks"
TASK_ATTEMPTS = "task_attempts"
TASK_METERS = (SUCCESSFUL_TASKS, FAILED_TASKS, TASK_ATTEMPTS)
ABANDONED_TASKS = "abandoned_tasks"  # reported, never priced
# The meter that counts a task, by its outcome (infermeter.task.v1's `outcome`).
TASK_OUTCOME_METERS = {"succeeded": SUCCESSFUL_TASKS, "failed": FAILED_TASKS, "abandoned": ABANDONED_TASKS}

GPU_METER = "gpu_seconds"

BUILTIN_METERS = (*REQUEST_METERS, GPU_METER, *TASK_METERS)  # the meters a charge may name, but usage meters
USAGE_PREFIX = "usage:"


def usage_meter(name: str) -> str:
    """The meter a charge names for the infermeter.usage.v1 meter `name`: `usage:<name>`."""
    return USAGE_PREFIX + name


def is_usage_meter(meter: str) -> bool:
    return meter.startswith(USAGE_PREFIX)
