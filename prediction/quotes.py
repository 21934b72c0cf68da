"""Quotes: what a request, and a successful task, is expected to cost under a price book.

A quote prices usage at the book's list price: every charge without its free allowance, no minimum
commitment, no prepaid credits, tiered prices from their first tier: what the usage adds to an
invoice once the period's allowance is used up (an upper bound where later tiers are cheaper), the
way budgets price a reservation. Amounts are exact decimals (the lines' precise amounts, not rounded
to the cent: a request costs fractions of one), shown at QUOTE_PLACES decimal places.

- Per request: the prompt's tokens (uncached and cached by the predicted cached fraction), the output
  at its mean (expected) and at p10 and p90 (the 80% interval; the cost grows with the output).
- Per successful task of K steps: tasks are drawn from the customer x model's task sample
  (`prediction.tasks`), each giving its outcome, attempts and its requests per first-attempt request;
  a drawn task runs K x that many requests of the quoted prompt, each output drawn from the request
  prediction's quantiles; tasks are drawn until one succeeds, and the sequence is priced with its task
  meters (successful_tasks 1, failed_tasks, task_attempts). SIMULATIONS seeded draws give the mean
  and the 80% interval. Without task history every task is taken to succeed at its first attempt.
- Meters a quote cannot predict (gpu_seconds, usage meters) are listed as not quoted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal

from prediction.distribution import Distribution
from prediction.request import RequestPrediction
from prediction.tasks import TaskCell, TaskSample
from pricing.book import PriceBook
from pricing.meters import (
    CACHED_INPUT_TOKENS,
    FAILED_TASKS,
    OUTPUT_TOKENS,
    REQUEST_METERS,
    REQUESTS,
    SUCCESSFUL_TASKS,
    TASK_ATTEMPTS,
    TASK_METERS,
    UNCACHED_INPUT_TOKENS,
)
from pricing.rating import rate
from pricing.usage import Usage, UsageKey

SIMULATIONS = 400
MAX_TASKS_PER_SUCCESS = 100  # a simulated run gives up after this many tasks without a success
QUOTE_PLACES = 6
_QUANTUM = Decimal(1).scaleb(-QUOTE_PLACES)
QUOTED_METERS = frozenset({*REQUEST_METERS, *TASK_METERS})  # the meter vocabulary: pricing.meters


class QuoteError(ValueError):
    """A quote that cannot be made (the message says why)."""


def list_price_book(book: PriceBook) -> PriceBook:
    """The book as a quote prices: no free allowances, minimum or prepaid credits."""
    return book.model_copy(update={"minimum": None, "credits": None,
                                   "charges": [c.model_copy(update={"free": Decimal(0)}) for c in book.charges]})


def not_quoted(book: PriceBook) -> list[str]:
    """The meters the book charges that a quote leaves out."""
    return sorted({c.meter for c in book.charges if c.meter not in QUOTED_METERS})


def price(book: PriceBook, customer_id: str, quantities: dict[UsageKey, Decimal | int], period) -> Decimal:
    """The exact (unrounded) amount of `quantities` under `book` (already a list-price book)."""
    usage = Usage.build(customer_id, period[0], period[1], quantities.items())
    return sum((line.precise_amount for line in rate(book, usage).lines), Decimal(0))


def quoted(amount: Decimal) -> Decimal:
    return amount.quantize(_QUANTUM, rounding=ROUND_HALF_UP)


def _request_quantities(model: str, prompt_tokens: int, cached_fraction: float, output_tokens: float
                        ) -> dict[UsageKey, Decimal | int]:
    cached = round(prompt_tokens * cached_fraction)
    return {UsageKey(UNCACHED_INPUT_TOKENS, model): prompt_tokens - cached,
            UsageKey(CACHED_INPUT_TOKENS, model): cached,
            UsageKey(OUTPUT_TOKENS, model): Decimal(str(round(output_tokens, 3))), UsageKey(REQUESTS, model): 1}


def request_cost(book: PriceBook, customer_id: str, model: str, prompt_tokens: int, prediction: RequestPrediction,
                 period) -> Distribution:
    """A request's cost under `book` (a list-price book): expected at the mean output, the 80% interval
    at the p10 and p90 outputs."""
    at = lambda output: price(book, customer_id, _request_quantities(  # noqa: E731
        model, prompt_tokens, prediction.cached_fraction, output), period)
    return Distribution(at(prediction.output_tokens_mean), at(prediction.output_tokens_p10),
                        at(prediction.output_tokens_p50), at(prediction.output_tokens_p90))


def draw_output(prediction: RequestPrediction, u: float) -> float:
    """An output drawn from the prediction's quantiles (linear between (0, 0), p10, p50, p90, p99 and
    one p99-p90 step beyond p99 at 1)."""
    p = prediction
    knots = ((0.0, 0.0), (0.1, p.output_tokens_p10), (0.5, p.output_tokens_p50), (0.9, p.output_tokens_p90),
             (0.99, p.output_tokens_p99), (1.0, p.output_tokens_p99 + (p.output_tokens_p99 - p.output_tokens_p90)))
    for (q0, v0), (q1, v1) in zip(knots, knots[1:], strict=False):
        if u <= q1:
            return v0 + (v1 - v0) * (u - q0) / (q1 - q0)
    return float(knots[-1][1])


def cost_per_successful_task(book: PriceBook, customer_id: str, model: str, prompt_tokens: int, steps: int,
                             prediction: RequestPrediction, tasks: TaskCell, period, *,
                             simulations: int = SIMULATIONS, seed: str = "quote") -> Distribution:
    """The cost of one successful task of `steps` requests of `prompt_tokens` (see the module doc)."""
    if steps < 1:
        raise QuoteError("task steps must be at least 1")
    sample: Sequence[TaskSample] = tasks.sample or (TaskSample("succeeded", 1, 1, 1, 0, 0, 0),)
    if not any(s.outcome == "succeeded" for s in sample):
        raise QuoteError(f"no task of {customer_id} on {model} (or of its fallbacks) has succeeded: "
                         "there is no cost per successful task to quote")
    rng = random.Random(f"{seed}/{customer_id}/{model}/{prompt_tokens}/{steps}")
    cached = round(prompt_tokens * prediction.cached_fraction)
    costs = []
    for _ in range(simulations):
        requests = failed = attempts = 0
        output = 0.0
        for _ in range(MAX_TASKS_PER_SUCCESS):
            task = sample[rng.randrange(len(sample))]
            wanted = steps * task.request_overhead
            n = int(wanted) + (rng.random() < wanted - int(wanted))
            requests += n
            output += sum(draw_output(prediction, rng.random()) for _ in range(n))
            if task.outcome != "abandoned":
                attempts += task.attempts
            if task.outcome == "succeeded":
                break
            failed += task.outcome == "failed"
        else:
            raise QuoteError(f"{customer_id} on {model}: no success in {MAX_TASKS_PER_SUCCESS} simulated tasks")
        quantities = {UsageKey(UNCACHED_INPUT_TOKENS, model): requests * (prompt_tokens - cached),
                      UsageKey(CACHED_INPUT_TOKENS, model): requests * cached,
                      UsageKey(OUTPUT_TOKENS, model): Decimal(str(round(output, 3))),
                      UsageKey(REQUESTS, model): requests, UsageKey(SUCCESSFUL_TASKS): 1,
                      UsageKey(FAILED_TASKS): failed, UsageKey(TASK_ATTEMPTS): attempts}
        costs.append(price(book, customer_id, quantities, period))
    return Distribution.of(costs)
