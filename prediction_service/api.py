"""Predictions over HTTP.

    POST /v1/quotes              a customer's own key (or the admin token with `customer_id`):
                                 {"model", "prompt_tokens", "task_steps"?, "max_tokens"?, "customer_id"?}
                                 -> the quote of `infermeter quote --json` (prediction_service.quotes)
    GET  /v1/predictions/status  admin: what is fitted (`infermeter predict status --json`)

Errors answer `{"error": {"message", "code"}}`: 400 invalid_request (bad JSON, an unknown field, a number
out of range), 404 unknown_customer / unknown_model (and another customer's id given with a customer
key: not_found), 409 no_plan or not_fitted (no predictors fitted yet). Mount with
`app.include_router(prediction_service.api.router)`; it reads `request.app.state.pool`. The clock is
`infermeter.http.now` (a dependency).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from infermeter.http import Now, PrincipalDep, error, error_responses, scope

router = APIRouter(tags=["predictions"])

QUOTE_FIELDS = {"model", "prompt_tokens", "task_steps", "max_tokens", "customer_id"}
_QUOTE_EXAMPLE = {"model": "kimi-chat", "prompt_tokens": 4000, "task_steps": 3}
QUOTE_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False, "required": ["model", "prompt_tokens"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "prompt_tokens": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
        "task_steps": {"type": "integer", "minimum": 1, "maximum": 1000},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
        "customer_id": {"type": "string", "minLength": 1, "description": "admin only; customers quote themselves"},
    }}, "example": _QUOTE_EXAMPLE}}}}


async def _call(request: Request, work) -> Any:
    from prediction_service.quotes import QuoteRefused

    def run() -> Any:
        with request.app.state.pool.connection() as conn:
            conn.autocommit = True
            conn.execute("SET TIME ZONE 'UTC'")
            try:
                return work(conn)
            except QuoteRefused as exc:
                raise error(exc.status, str(exc), exc.code) from None

    return await run_in_threadpool(run)


@router.post("/v1/quotes", responses=error_responses(400, 401, 403, 404, 409), openapi_extra=QUOTE_BODY)
async def post_quote(request: Request, principal: PrincipalDep, at: Now) -> dict[str, Any]:
    """Expected cost of a request and of a successful task under the customer's price book, 80% interval."""
    from prediction_service.quotes import quote

    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise error(400, "the body must be a JSON object such as " + json.dumps(_QUOTE_EXAMPLE),
                    "invalid_request") from None
    if not isinstance(body, dict):
        raise error(400, "the body must be a JSON object such as " + json.dumps(_QUOTE_EXAMPLE), "invalid_request")
    unknown = sorted(set(body) - QUOTE_FIELDS)
    if unknown:
        raise error(400, f"unknown field(s) {', '.join(unknown)}: expected {', '.join(sorted(QUOTE_FIELDS))}",
                    "invalid_request")
    for name in ("model", "prompt_tokens"):
        if name not in body:
            raise error(400, f"{name} is required", "invalid_request")
    requested = body.get("customer_id")
    if requested is not None and not isinstance(requested, str):
        raise error(400, "customer_id must be a string", "invalid_request")
    customer = scope(principal, requested)
    if customer is None:
        raise error(400, "customer_id is required with the admin token", "invalid_request")
    return await _call(request, lambda conn: quote(conn, customer, body["model"], body["prompt_tokens"], at=at,
                                                   task_steps=body.get("task_steps"),
                                                   max_tokens=body.get("max_tokens")))


@router.get("/v1/predictions/status", responses=error_responses(401, 403))
async def get_status(request: Request, principal: PrincipalDep) -> dict[str, Any]:
    """What is fitted: the version in force, its window, when, how many rows (admin)."""
    from prediction_service.store import status

    if not principal.is_admin:
        raise error(403, "the predictors' status needs the admin token", "forbidden")
    return await _call(request, status)
