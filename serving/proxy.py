"""The proxy: one completions / chat completions request from its body to vLLM's answer.

`proxy` authenticates, checks the body and the task headers, and builds the request's context;
`serve` asks admission (budgets and rate limits, serving/budgets.py), opens the upstream request on
a replica (serving/routing.py; a refused connection is retried once on another live replica) and
answers vLLM's own bytes, or a `MeteredStream` (serving/relay.py) for streams. Each exit arranges
the request's one usage event.

Hot path: plain functions called from `GatewayApp`; the upstream pool is serving/upstream_http.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime

import orjson
from fastapi import Request
from starlette.responses import Response

from serving import metrics
from serving.gateway_context import (
    ATTEMPT_HEADER,
    TASK_HEADER,
    GatewayState,
    RequestContext,
    acting_customer,
    authenticate,
)
from serving.gateway_contracts import Rejected
from serving.openai_api import (
    ApiError,
    bad_request,
    error_response,
    parse_body,
    prompt_token_bound,
    upstream_error,
)
from serving.relay import MeteredStream, finish, finish_after_send, release, with_headers
from serving.routing import pick_replica
from serving.task_endpoints import remember_task
from serving.upstream_http import UpstreamConnectError, UpstreamError, UpstreamResponse
from serving.upstreams import ModelRoute

log = logging.getLogger("serving.gateway")

DEFAULT_CONTEXT_LENGTH = 8192


def task_headers(request: Request) -> tuple[str | None, int]:
    task_id = request.headers.get(TASK_HEADER)
    attempt_raw = request.headers.get(ATTEMPT_HEADER)
    if task_id is not None and not (0 < len(task_id) <= 256):
        raise bad_request(f"{TASK_HEADER} must be 1 to 256 characters")
    if attempt_raw is None:
        return task_id or None, 1
    try:
        attempt = int(attempt_raw)
    except ValueError:
        attempt = 0
    if not 1 <= attempt <= 1_000_000:
        raise bad_request(f"{ATTEMPT_HEADER} must be an integer from 1 to 1000000")
    return task_id or None, attempt


async def proxy(state: GatewayState, request: Request, kind: str) -> tuple[Response, RequestContext]:
    started_at = datetime.now(UTC)
    started_mono = time.perf_counter()
    principal = await authenticate(state, request)
    customer_id = acting_customer(principal, request)
    task_id, attempt = task_headers(request)
    body = parse_body(await request.body(), kind)
    route = state.upstreams.route(body["model"])
    if route is None:
        raise ApiError(
            404,
            f"the model '{body['model']}' does not exist",
            code="model_not_found",
            param="model",
            type_="not_found_error",
        )
    ctx = RequestContext(
        request_id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        principal=principal,
        customer_id=customer_id,
        kind=kind,
        route=route,
        body=body,
        started_at=started_at,
        started_mono=started_mono,
        task_id=task_id,
        attempt=attempt,
    )
    if task_id is not None:
        remember_task(state, customer_id, task_id)
    try:
        return await serve(state, ctx), ctx
    except Exception:  # a bug or a broken collaborator: still exactly one event, and an OpenAI error
        log.exception("request %s failed inside the gateway", ctx.request_id)
        if ctx.replica is not None and not ctx.finished:
            release(ctx)
        await finish(state, ctx, "error", tags={"error": "gateway_error"})
        return with_headers(
            error_response(500, "the gateway failed to serve this request", "api_error", "gateway_error"), ctx
        ), ctx


async def serve(state: GatewayState, ctx: RequestContext) -> Response:
    body = ctx.body
    route = ctx.route
    if state.admission is not None:
        try:
            rejected = await admit(state, ctx)
        except Exception:
            log.exception("admission failed for %s", ctx.request_id)
            finish_after_send(state, ctx, "error", tags={"error": "admission_unavailable"}, settle=False)
            return with_headers(
                error_response(
                    503, "budgets and rate limits cannot be checked right now; retry shortly", "api_error",
                    "admission_unavailable",
                ),
                ctx,
            )  # fmt: skip
        if rejected is not None:
            return rejected

    stream = bool(body.get("stream"))
    payload = upstream_payload(ctx, stream)
    try:
        response = await open_upstream(state, ctx, payload)
    except ApiError as exc:
        finish_after_send(state, ctx, "error", tags={"error": exc.code or "upstream"})
        return with_headers(exc.response(), ctx)
    except BaseException:
        await finish(state, ctx, "cancelled")
        raise

    if response.status != 200:
        try:
            data = await response.read()
        except (TimeoutError, UpstreamError):
            data = b""
        finally:
            response.release()
            release(ctx)
        finish_after_send(state, ctx, "error", tags={"error": f"upstream_{response.status}"})
        return with_headers(upstream_error(response.status, data), ctx)

    if stream:
        return MeteredStream(state, ctx, response)

    try:
        data = await response.read()
    except (TimeoutError, UpstreamError) as exc:
        finish_after_send(state, ctx, "error", tags={"error": "upstream_broken"})
        return with_headers(
            error_response(
                502, f"the upstream replica failed mid-response: {exc}", "api_error", "upstream_error"
            ),
            ctx,
        )
    except BaseException:
        await finish(state, ctx, "cancelled")
        raise
    finally:
        response.release()
        release(ctx)
    received_at = datetime.now(UTC)

    async def finish_ok() -> None:
        usage = None
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            usage = orjson.loads(data).get("usage")
        await finish(
            state,
            ctx,
            "ok",
            usage=usage,
            usage_final=True,
            first_token_at=received_at,
            finished_at=received_at,
        )

    ctx.after_send = finish_ok
    if route.upstream_model != route.name:
        data = data.replace(
            f'"model":"{route.upstream_model}"'.encode(), f'"model":"{route.name}"'.encode(), 1
        )
    return with_headers(Response(data, media_type="application/json"), ctx)


def upstream_payload(ctx: RequestContext, stream: bool) -> bytes:
    body = ctx.body
    if stream:
        body = dict(body)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if ctx.route.upstream_model != ctx.route.name:
        body = dict(body)
        body["model"] = ctx.route.upstream_model
    return orjson.dumps(body)


async def open_upstream(state: GatewayState, ctx: RequestContext, payload: bytes) -> UpstreamResponse:
    """POST to a replica; a refused connection is retried once on another live replica."""
    path = "/v1/chat/completions" if ctx.kind == "chat" else "/v1/completions"
    tried: set[str] = set()
    last_error = ""
    for _ in range(min(2, len(ctx.route.replicas))):
        replica = pick_replica(ctx.route, ctx.body)
        if replica.replica_id in tried:
            replica = next((r for r in ctx.route.replicas if r.replica_id not in tried), replica)
        tried.add(replica.replica_id)
        ctx.replica = replica
        replica.in_flight += 1
        try:
            response = await state.upstream.request("POST", replica.url + path, payload)
        except UpstreamConnectError as exc:
            replica.in_flight -= 1
            ctx.route.mark_down(replica)
            last_error = f"cannot connect to replica {replica.replica_id}: {exc}"
            continue
        except TimeoutError:
            replica.in_flight -= 1
            raise ApiError(
                504, "the upstream replica did not answer in time", type_="api_error", code="upstream_timeout"
            ) from None
        except UpstreamError as exc:
            replica.in_flight -= 1
            raise ApiError(
                502, f"the upstream replica failed: {exc}", type_="api_error", code="upstream_error"
            ) from None
        except BaseException:
            replica.in_flight -= 1
            raise
        if replica.down_until:
            ctx.route.mark_up(replica)
        ctx.holds_replica = True
        return response
    raise ApiError(
        503,
        f"no replica of model '{ctx.route.name}' is reachable ({last_error})",
        type_="api_error",
        code="upstream_unavailable",
    )


# --- admission (budgets and rate limits, serving/budgets.py) -----------------------------------


async def admit(state: GatewayState, ctx: RequestContext) -> Response | None:
    """None when admitted (its headers join the response's), else the rejection's response."""
    body = ctx.body
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = await context_length(state, ctx.route)
    max_tokens *= body.get("n") or 1
    result = await state.admission.admit(
        ctx.customer_id,
        model=ctx.route.name,
        request_id=ctx.request_id,
        prompt_tokens=prompt_token_bound(body),
        max_tokens=max_tokens,
    )
    if isinstance(result, Rejected):
        metrics.record_rejection(result.reason)
        finish_after_send(state, ctx, "rejected", tags={"reason": result.reason}, settle=False)
        response = Response(
            orjson.dumps(result.openai_error()), status_code=result.status, media_type="application/json"
        )
        for name, value in result.headers.items():
            response.headers[name] = str(value)
        return with_headers(response, ctx)
    ctx.admitted = result.limited  # Admitted: unlimited customers have nothing to settle
    if result.headers:
        ctx.extra_headers.update({name: str(value) for name, value in result.headers.items()})
    return None


async def context_length(state: GatewayState, route: ModelRoute) -> int:
    """The model's context length, asked once from a replica's /v1/models (vLLM's max_model_len)."""
    known = state.context_lengths.get(route.name)
    if known:
        return known
    length = DEFAULT_CONTEXT_LENGTH
    for replica in route.replicas:
        try:
            async with asyncio.timeout(5):
                resp = await state.upstream.request("GET", replica.url + "/v1/models")
                try:
                    listing = orjson.loads(await resp.read())
                finally:
                    resp.release()
            for model in listing.get("data", ()):
                if model.get("id") == route.upstream_model and isinstance(model.get("max_model_len"), int):
                    length = model["max_model_len"]
                    state.context_lengths[route.name] = length
                    return length
        except (TimeoutError, UpstreamError, ValueError, AttributeError):
            continue
    return length
