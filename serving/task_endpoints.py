"""Task and tool endpoints: a task's outcome and a customer's tool / verification usage.

- `POST /v1/tasks/{task_id}/outcome` `{"outcome": "succeeded|failed|abandoned", "finished_at"?,
  "failure_cause"?}` emits `infermeter.task.v1` (`failure_cause`: why the task failed or was retried,
  one of runtime, capacity, routing, client, model, verifier; the cost anatomy's failure attribution). A customer reports only on its own tasks: the task must have been
  seen with the caller's customer (on this gateway, `remember_task`, or in metering's
  `task_attempts`), else 404, the same answer as for an unknown task.
- `POST /v1/events` `{"meter", "quantity", "task_id"?, "id"?, "occurred_at"?}` emits
  `infermeter.usage.v1` for the caller's customer (`id` makes client retries idempotent).

Source: what a customer key reports carries the customer's own source, `//customer/<customer_id>`
(`metering.contract.customer_source`), never the gateway's: a price book that trusts the gateway's
or a verifier's outcomes must not believe a customer's word about its own tasks. Producer and admin
credentials report under the gateway's source.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from infermeter.times import TimeInputError, parse_time
from metering.contract import (
    FAILURE_CAUSES,
    TASK_OUTCOMES,
    customer_source,
    decode_event,
    encode_event,
    task_event,
    usage_event,
)
from serving.gateway_context import GatewayState, acting_customer, authenticate
from serving.openai_api import ApiError, bad_request, read_json_object

RECENT_TASKS_MAX = 200_000


def remember_task(state: GatewayState, customer_id: str, task_id: str) -> None:
    key = (customer_id, task_id)
    tasks = state.recent_tasks
    if key in tasks:
        tasks.move_to_end(key)
        return
    tasks[key] = True
    if len(tasks) > RECENT_TASKS_MAX:
        tasks.popitem(last=False)


def _task_known_in_metering(engine: Any, customer_id: str, task_id: str) -> bool:
    from metering.task_reads import task_exists

    conn = engine.raw_connection()  # the pool's psycopg connection
    try:
        return task_exists(conn.driver_connection, customer_id, task_id)
    finally:
        conn.rollback()
        conn.close()


def _time_field(value: Any, name: str) -> datetime:
    """The body field `name` as an aware UTC instant (RFC 3339 with an offset); now when absent."""
    if value is None:
        return datetime.now(UTC)
    try:
        return parse_time(value, name, bare_date=False)
    except TimeInputError as exc:
        raise bad_request(str(exc), name) from None


def _source(state: GatewayState, principal: Any, customer_id: str) -> str:
    """The source of an event reported through the gateway: the customer's own for a customer key."""
    return customer_source(customer_id) if principal.kind == "customer" else state.source


async def post_task_outcome(state: GatewayState, task_id: str, request: Request) -> Response:
    principal = await authenticate(state, request)
    body = await read_json_object(request)
    customer_id = acting_customer(principal, request, body.get("customer_id"))
    if principal.kind == "customer" and body.get("customer_id") not in (None, customer_id):
        raise ApiError(404, f"task '{task_id}' not found", type_="not_found_error", code="task_not_found")
    outcome = body.get("outcome")
    if outcome not in TASK_OUTCOMES:
        raise bad_request(f"'outcome' must be one of {', '.join(TASK_OUTCOMES)}", "outcome")
    if not 0 < len(task_id) <= 256:
        raise bad_request("the task id must be 1 to 256 characters")
    finished_at = _time_field(body.get("finished_at"), "finished_at")
    failure_cause = body.get("failure_cause")
    if failure_cause is not None and failure_cause not in FAILURE_CAUSES:
        raise bad_request(f"'failure_cause' must be one of {', '.join(FAILURE_CAUSES)}", "failure_cause")
    known = (customer_id, task_id) in state.recent_tasks
    if not known and state.engine is not None:
        known = await asyncio.to_thread(_task_known_in_metering, state.engine, customer_id, task_id)
    if not known:  # unknown, or another customer's: the same answer, so existence is not disclosed
        raise ApiError(404, f"task '{task_id}' not found", type_="not_found_error", code="task_not_found")
    event_id = body.get("id") if isinstance(body.get("id"), str) and body.get("id") else None
    event = task_event(
        source=_source(state, principal, customer_id),
        customer_id=customer_id,
        task_id=task_id,
        outcome=outcome,
        finished_at=finished_at,
        event_id=event_id,
        failure_cause=failure_cause,
    )
    state.sink.emit(event)
    payload = {"task_id": task_id, "customer_id": customer_id, "outcome": outcome, "event_id": event["id"]}
    return Response(orjson.dumps(payload), status_code=202, media_type="application/json")


async def post_usage_event(state: GatewayState, request: Request) -> Response:
    principal = await authenticate(state, request)
    body = await read_json_object(request)
    customer_id = acting_customer(principal, request, body.get("customer_id"))
    if principal.kind == "customer" and body.get("customer_id") not in (None, customer_id):
        raise ApiError(
            403, "a customer key may only report its own usage", type_="permission_error", code="forbidden"
        )
    meter = body.get("meter")
    if not isinstance(meter, str) or not meter:
        raise bad_request("'meter' is required (e.g. 'tool_calls')", "meter")
    quantity_raw = body.get("quantity")
    if isinstance(quantity_raw, bool) or not isinstance(quantity_raw, str | int):
        raise bad_request("'quantity' must be a decimal string or an integer", "quantity")
    try:
        quantity = Decimal(str(quantity_raw))
    except InvalidOperation:
        raise bad_request("'quantity' must be a decimal string or an integer", "quantity") from None
    if not quantity.is_finite() or quantity < 0:
        raise bad_request("'quantity' must be a non-negative decimal", "quantity")
    task_id = body.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise bad_request("'task_id' must be a string", "task_id")
    event_id = body.get("id") if isinstance(body.get("id"), str) and body.get("id") else None
    try:
        event = usage_event(
            source=_source(state, principal, customer_id),
            customer_id=customer_id,
            meter=meter,
            quantity=format(quantity, "f"),
            task_id=task_id,
            occurred_at=_time_field(body.get("occurred_at"), "occurred_at"),
            event_id=event_id,
        )
        decode_event(encode_event(event), now=datetime.now(UTC), max_bytes=state.settings.max_event_bytes)
    except Exception as exc:  # InvalidEvent: say which field
        raise bad_request(f"invalid usage event: {exc}") from None
    state.sink.emit(event)
    return Response(
        orjson.dumps({"event_id": event["id"], "customer_id": customer_id}),
        status_code=202,
        media_type="application/json",
    )
