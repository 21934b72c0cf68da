"""The proxy: one completions / chat completions request from its body to vLLM's answer.

`proxy` authenticates, checks the body and the task headers, and builds the request's context;
`serve` asks admission (budgets and rate limits, serving/budgets.py), opens the upstream request on
a replica (`open_upstream`: serving/routing.py picks it; a try that fails before anything reached
the client goes to another replica, or to the model's fallback model, within
INFERMETER_FAILOVER_ATTEMPTS tries and the client's deadline) and answers vLLM's own bytes, or a
`MeteredStream` (serving/relay.py) for streams. Each exit arranges the request's one usage event.
A customer restricted to regions (serving/residency.py) is only ever tried on healthy replicas in
them, failover and fallback included; with none left it gets 503 and a `rejected`/`residency` event.

Hot path: plain functions called from `GatewayApp`; the upstream pool is serving/upstream_http.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

import orjson
from fastapi import Request
from starlette.responses import Response

from serving import metrics
from serving.gateway_context import (
    ATTEMPT_HEADER,
    TASK_HEADER,
    TIMEOUT_HEADER,
    GatewayState,
    ProxyRequest,
    RequestContext,
    acting_customer,
    authenticate,
    new_request_id,
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
from serving.predictions import Prediction
from serving.relay import JsonAnswer, MeteredStream, finish, finish_after_send, release, with_headers
from serving.residency import RESIDENCY_REASON, pick_allowed, rejection
from serving.routing import pick_in_chain, pick_replica
from serving.task_endpoints import remember_task
from serving.upstream_http import UpstreamConnectError, UpstreamError, UpstreamResponse
from serving.upstreams import ModelRoute

log = logging.getLogger("serving.gateway")

DEFAULT_CONTEXT_LENGTH = 8192


def task_headers(request: Request | ProxyRequest) -> tuple[str | None, int]:
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


async def proxy(state: GatewayState, request: ProxyRequest, kind: str) -> tuple[Response, RequestContext]:
    started_at = datetime.now(UTC)
    started_mono = time.perf_counter()
    principal = await authenticate(state, request)
    customer_id = acting_customer(principal, request)
    task_id, attempt = task_headers(request)
    raw_body = await request.body()
    body = parse_body(raw_body, kind)
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
        request_id=new_request_id(kind),
        principal=principal,
        customer_id=customer_id,
        kind=kind,
        route=route,
        body=body,
        raw_body=raw_body,
        started_at=started_at,
        started_mono=started_mono,
        task_id=task_id,
        attempt=attempt,
        headers=request.headers,
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
    if state.predictor is not None:  # the newest fit's lookup (serving/predictions.py)
        ctx.prediction = predict(state, ctx)
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
    if state.arrivals is not None:  # the capacity signal's demand at arrival (serving/capacity_arrivals.py)
        prediction = ctx.prediction
        state.arrivals.arrive(route.deployment_id, 0 if prediction is None else prediction.output_tokens_p50)

    stream = bool(body.get("stream"))
    if state.residency is not None:  # the replicas outside the customer's regions, if any
        ctx.excluded = await state.residency.excluded(ctx.customer_id, route)
    try:
        response, data = await open_upstream(state, ctx, stream)
    except UpstreamFailed as exc:
        finish_after_send(state, ctx, exc.status, tags=exc.tags)
        return with_headers(exc.response, ctx)
    except BaseException:
        await finish(state, ctx, "cancelled")
        raise

    if response.status != 200:  # vLLM's 4xx (not 429): the request's own fault, passed through
        finish_after_send(state, ctx, "error", tags={"error": f"upstream_{response.status}"})
        return with_headers(upstream_error(response.status, data), ctx)

    if stream:
        return MeteredStream(state, ctx, response)

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
    route = ctx.route  # the model that served it (a fallback model's, after a failover)
    if route.upstream_model != route.name:
        data = data.replace(
            f'"model":"{route.upstream_model}"'.encode(), f'"model":"{route.name}"'.encode(), 1
        )
    return JsonAnswer(data, ctx)


def upstream_payload(ctx: RequestContext, stream: bool, route: ModelRoute | None = None) -> bytes:
    """The body sent to a replica of `route` (default: the model asked for): the client's own bytes
    when nothing in it changes (not a stream, the replica's model name the same)."""
    body = ctx.body
    route = route or ctx.route
    if not stream and route.upstream_model == body["model"] and ctx.raw_body is not None:
        return ctx.raw_body
    if stream:
        body = dict(body)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if route.upstream_model != body["model"]:
        body = dict(body)
        body["model"] = route.upstream_model
    return orjson.dumps(body)


# --- failover --------------------------------------------------------------------------------


class UpstreamFailed(Exception):
    """Every try failed (or no time was left for another): what the client gets, the event's tag.
    `status` rejected: no replica in the customer's regions could take it (data residency)."""

    def __init__(self, response: Response, tag: str, status: str = "error") -> None:
        super().__init__(tag)
        self.response = response
        self.tag = tag
        self.status = status
        self.tags = {"reason" if status == "rejected" else "error": tag}


def residency_rejected(state: GatewayState, ctx: RequestContext, model: str) -> UpstreamFailed:
    """No replica in the restricted customer's regions can serve now: 503, event rejected/residency."""
    metrics.record_rejection(RESIDENCY_REASON)
    regions = state.residency.cached(ctx.customer_id)
    return UpstreamFailed(rejection(model, ctx.customer_id, regions).response(), RESIDENCY_REASON, "rejected")


class _TryFailed(Exception):
    """One try failed before anything reached the client; `reason` is the metric label."""

    def __init__(self, reason: str, detail: str, status: int = 0, data: bytes = b"") -> None:
        super().__init__(detail)
        self.reason = reason  # connect | reset | timeout | http_5xx | http_429
        self.detail = detail
        self.status = status
        self.data = data

    def failed(self, model: str, replica_id: str) -> UpstreamFailed:
        """The client's error when this was the last try (`replica_id` the replica it went to)."""
        if self.status:  # vLLM's own 5xx / 429, passed through
            return UpstreamFailed(upstream_error(self.status, self.data), f"upstream_{self.status}")
        if self.reason == "connect":
            error = ApiError(
                503, f"no replica of model '{model}' is reachable (replica {replica_id}: {self.detail})",
                type_="api_error", code="upstream_unavailable",
            )  # fmt: skip
        elif self.reason == "timeout":
            error = ApiError(504, self.detail, type_="api_error", code="upstream_timeout")
        else:
            error = ApiError(
                502, f"the upstream replica failed: {self.detail}", type_="api_error", code="upstream_error"
            )
        return UpstreamFailed(error.response(), error.code)


def client_deadline(ctx: RequestContext) -> float | None:
    """perf_counter() time by which the client wants its answer (X-Infermeter-Timeout-S, seconds
    from when the gateway received the request), or None. Read only when a try failed."""
    raw = ctx.headers.get(TIMEOUT_HEADER) if ctx.headers is not None else None
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return ctx.started_mono + seconds if 0 < seconds < 1e9 else None


async def open_upstream(
    state: GatewayState, ctx: RequestContext, stream: bool
) -> tuple[UpstreamResponse, bytes | None]:
    """Send the request to a replica, failing over until one answers or the tries run out.

    Returns (response, body): a 200 stream with its first chunk in (body None; the caller relays
    it, `ctx.holds_replica`), else the whole body read and the connection released (a 200, or a
    4xx other than 429 to pass through). A try fails on: refused or timed-out connection, a
    connection reset or closed before the answer (or, for a stream, before its first chunk), no
    answer within INFERMETER_UPSTREAM_TIMEOUT_S, a 5xx or 429. The replica's breaker opens
    (serving/upstreams.py) and the next try goes to another replica (serving/routing.py
    `pick_in_chain`: same model first, then the fallback models), up to
    INFERMETER_FAILOVER_ATTEMPTS tries in all, never the same replica twice, and none started after
    the client's deadline (`client_deadline`). Nothing has reached the client at that point, so a
    retry cannot show it two answers; only the serving try's tokens are metered. Raises
    `UpstreamFailed` (the last failure's error) when no try succeeded.

    Success path cost over a plain request: the `healthy_only` pick and a few attribute reads.
    """
    path = "/v1/chat/completions" if ctx.kind == "chat" else "/v1/completions"
    requested = route = ctx.route
    body = ctx.body
    excluded = ctx.excluded
    if excluded is None:
        replica = pick_replica(route, body, healthy_only=True)
        if replica is None:  # every breaker of this model is open: a fallback model, or the first to reopen
            route, replica = pick_in_chain(requested, body)
    else:  # a restricted customer: healthy replicas in its regions only (serving/residency.py)
        chosen = pick_allowed(requested, body, excluded)
        if chosen is None:
            raise residency_rejected(state, ctx, requested.name)
        route, replica = chosen
    payload = upstream_payload(ctx, stream, route)
    tried: set[str] | None = None
    deadline: float | None = None
    while True:
        if route is not requested:
            ctx.route = route
            ctx.fallback_from = requested.name
        ctx.replica = replica
        ctx.upstream_attempts += 1
        probe = replica.down_until != 0.0  # half-open (or all open): this request decides
        if probe:
            route.claim_probe(replica)
        replica.in_flight += 1
        try:
            if deadline is None:
                response, data = await _try(state, replica.url + path, payload, stream, None)
            else:
                response, data = await _try_within(state, replica.url + path, payload, stream, deadline)
        except _TryFailed as failure:
            replica.in_flight -= 1
            if route.mark_down(replica):
                metrics.BREAKER_OPENED.labels(model=route.name, replica=replica.replica_id).inc()
            metrics.record_failover(route.name, failure.reason)
            if tried is None:
                tried = set()
                deadline = client_deadline(ctx)
            tried.add(replica.replica_id)
            chosen = None
            in_region = True  # False: another try was due, but no replica in the customer's regions is left
            if ctx.upstream_attempts < state.settings.failover_attempts and (
                deadline is None or deadline > time.perf_counter()
            ):
                if excluded is None:
                    chosen = pick_in_chain(requested, body, tried)
                else:
                    chosen = pick_allowed(requested, body, excluded, tried)
                    in_region = chosen is not None
            log.warning(
                "request %s: try %d on replica %s of %s failed (%s: %s); %s",
                ctx.request_id, ctx.upstream_attempts, replica.replica_id, route.name, failure.reason,
                failure.detail, f"retrying on {chosen[1].replica_id}" if chosen else
                "no retry" if in_region else "no replica left in the customer's regions",
            )  # fmt: skip
            if chosen is None:
                if not in_region:
                    raise residency_rejected(state, ctx, requested.name) from None
                raise failure.failed(requested.name, replica.replica_id) from None
            if chosen[0] is not route:
                route = chosen[0]
                payload = upstream_payload(ctx, stream, route)
            replica = chosen[1]
            continue
        except BaseException:
            replica.in_flight -= 1
            if probe:  # undecided (cancelled): half-open again at once
                replica.down_until = time.monotonic()
            raise
        if replica.down_until:  # a probe (or an outage overlapped by this request) succeeded
            route.mark_up(replica)
        if data is None:
            ctx.holds_replica = True  # released when the stream ends
        else:
            replica.in_flight -= 1
        return response, data


async def _try(
    state: GatewayState, url: str, payload: bytes, stream: bool, timeout: float | None
) -> tuple[UpstreamResponse, bytes | None]:
    """One try: (a 200 stream with its first chunk in, None) or (response, whole body)."""
    try:
        response = await state.upstream.request("POST", url, payload, read_timeout_s=timeout)
    except UpstreamConnectError as exc:
        raise _TryFailed("connect", str(exc)) from None
    except TimeoutError:
        raise _TryFailed("timeout", "the upstream replica did not answer in time") from None
    except UpstreamError as exc:
        raise _TryFailed("reset", str(exc)) from None
    status = response.status
    try:
        if status == 200 and stream:
            await response.first_data()
            return response, None
        data = await response.read()
    except TimeoutError:
        response.close()
        raise _TryFailed("timeout", "the upstream replica did not answer in time") from None
    except UpstreamError as exc:
        response.close()
        raise _TryFailed("reset", str(exc)) from None
    except BaseException:
        response.close()
        raise
    response.release()
    if status >= 500 or status == 429:
        reason = "http_429" if status == 429 else "http_5xx"
        raise _TryFailed(reason, f"the replica answered {status}", status, data)
    return response, data


async def _try_within(
    state: GatewayState, url: str, payload: bytes, stream: bool, deadline: float
) -> tuple[UpstreamResponse, bytes | None]:
    """A retry bounded by the client's deadline (perf_counter time)."""
    remaining = deadline - time.perf_counter()
    try:
        async with asyncio.timeout(remaining):
            return await _try(state, url, payload, stream, min(remaining, state.upstream.read_timeout_s))
    except TimeoutError:
        raise _TryFailed("timeout", "no answer before the client's deadline") from None


# --- admission (budgets and rate limits, serving/budgets.py) -----------------------------------


def predict(state: GatewayState, ctx: RequestContext) -> Prediction | None:
    """The request's prediction at admission: customer, model, the prompt's token bound, the
    client's max_tokens (x n) as the cap, task and attempt; None without a fit, or when the lookup
    fails (a prediction is optional, the request is not)."""
    body = ctx.body
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        max_tokens *= body.get("n") or 1
    try:
        ctx.prompt_bound = bound = prompt_token_bound(body)
        return state.predictor.predict(ctx.customer_id, ctx.route.name, bound, max_tokens,
                                       ctx.task_id, ctx.attempt)
    except Exception:
        log.exception("predicting %s failed", ctx.request_id)
        return None


async def admit(state: GatewayState, ctx: RequestContext) -> Response | None:
    """None when admitted (its headers join the response's), else the rejection's response."""
    body = ctx.body
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = await context_length(state, ctx.route)
    max_tokens *= body.get("n") or 1
    prediction = ctx.prediction
    result = await state.admission.admit(
        ctx.customer_id,
        model=ctx.route.name,
        request_id=ctx.request_id,
        prompt_tokens=prompt_token_bound(body) if ctx.prompt_bound is None else ctx.prompt_bound,
        max_tokens=max_tokens,
        predicted_output_tokens=None if prediction is None else prediction.output_tokens_p99,
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
