"""Quotes for a customer: `infermeter quote` and `POST /v1/quotes` (prediction.quotes does the pricing).

The customer's book is its plan in force for the billing period containing `at` (billing_service);
the prediction is the fitted predictors' (`prediction_service.store.latest`). Errors are
`QuoteRefused` with a stable `code` and the HTTP status the API answers with:

    invalid_request   400  a number out of range, a missing field
    unknown_customer  404  no billing account with that id
    unknown_model     404  the predictors have never seen the model
    no_plan           409  the customer has no plan for the period
    not_fitted        409  no predictors fitted yet (`infermeter predict fit`)
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from billing_service.store import get_customer
from infermeter.times import utc_text
from prediction.quotes import (
    QuoteError,
    cost_per_successful_task,
    list_price_book,
    not_quoted,
    quoted,
    request_cost,
)
from prediction.request import RequestFeatures
from prediction_service.forecast import plan_of
from prediction_service.store import NotFitted, require_latest

MAX_PROMPT_TOKENS = 10_000_000
MAX_TASK_STEPS = 1000


class QuoteRefused(ValueError):
    def __init__(self, message: str, code: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _whole(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():  # 38141.0 is a JSON Schema integer too
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuoteRefused(f"{name} must be a whole number from {low} to {high}, got {value!r}", "invalid_request",
                           400)
    if not low <= value <= high:
        raise QuoteRefused(f"{name} must be from {low} to {high}, got {value}", "invalid_request", 400)
    return value


def quote(conn: psycopg.Connection, customer_id: str, model: str, prompt_tokens: int, *, at: datetime,
          task_steps: int | None = None, max_tokens: int | None = None) -> dict:
    """The customer's expected cost of a request of `model` with `prompt_tokens` (and `max_tokens`), and of
    a successful task of `task_steps` such requests (default: the customer's typical steps), each with
    an 80% interval, under its plan's book at list price (prediction.quotes)."""
    for name, value in (("customer", customer_id), ("model", model)):
        if not isinstance(value, str) or not value.strip():
            raise QuoteRefused(f"{name} must be a non-empty string", "invalid_request", 400)
    prompt_tokens = _whole("prompt_tokens", prompt_tokens, 1, MAX_PROMPT_TOKENS)
    if task_steps is not None:
        task_steps = _whole("task_steps", task_steps, 1, MAX_TASK_STEPS)
    if max_tokens is not None:
        max_tokens = _whole("max_tokens", max_tokens, 1, MAX_PROMPT_TOKENS)
    customer = get_customer(conn, customer_id)
    if customer is None:
        raise QuoteRefused(f"unknown customer {customer_id}: no billing account with that id", "unknown_customer", 404)
    try:
        fitted = require_latest(conn)
    except NotFitted as exc:
        raise QuoteRefused(str(exc), "not_fitted", 409) from None
    if not fitted.requests.knows_model(model):
        known = ", ".join(fitted.requests.models()) or "none"
        raise QuoteRefused(f"unknown model {model}: the predictors know {known}", "unknown_model", 404)
    period, book = plan_of(conn, customer, at)
    if book is None:
        raise QuoteRefused(f"customer {customer_id} has no price plan for the period {period.label}: assign one with "
                           f"`infermeter plans assign --customer {customer_id} --price-book FILE --from DATE`",
                           "no_plan", 409)
    prediction = fitted.requests.predict_request(RequestFeatures(customer_id, model, prompt_tokens, max_tokens))
    priced = list_price_book(book)
    span = (period.start, period.end)
    per_request = request_cost(priced, customer_id, model, prompt_tokens, prediction, span)
    tasks = fitted.tasks.predict_task(customer_id, model)
    steps = task_steps or tasks.typical_steps()
    try:
        per_task = cost_per_successful_task(priced, customer_id, model, prompt_tokens, steps, prediction, tasks, span)
    except QuoteError as exc:
        raise QuoteRefused(str(exc), "invalid_request", 400) from None
    return {
        "customer_id": customer_id, "model": model, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
        "currency": book.currency, "price_book": book.id, "period": period.label, "at": utc_text(at),
        "interval": "80%", "not_quoted": not_quoted(book),
        "request": {**per_request.to_json(quoted), "prediction": prediction.to_json()},
        "task": {**per_task.to_json(quoted), "steps": steps, "steps_given": task_steps is not None,
                 "history": tasks.to_json()},
        "fit_version": fitted.info.version,
    }
