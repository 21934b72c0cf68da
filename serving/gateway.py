"""The OpenAI-compatible gateway: auth, admission, routing, proxying to vLLM, usage capture.

`create_app(settings, ...)` builds the FastAPI app; `infermeter serve gateway` runs it with uvicorn.

Endpoints
- `POST /v1/chat/completions`, `POST /v1/completions`: proxied to a vLLM replica of the model
  (serving/upstreams.py, serving/routing.py), streaming (SSE) or not. Request bodies are checked
  here (JSON object, field types, known model) and refused with 400/404 before anything reaches
  vLLM. Responses are vLLM's own bytes, except on streams (below).
- `GET /v1/models`: the models of the upstream file.
- `POST /v1/tasks/{task_id}/outcome` `{"outcome": "succeeded|failed|abandoned", "finished_at"?}`:
  emits `infermeter.task.v1`. A customer reports only on its own tasks: the task must have been
  seen with the caller's customer (on this gateway, or in metering's `task_attempts`), else 404.
- `POST /v1/events` `{"meter", "quantity", "task_id"?, "id"?}`: tool / verification usage as
  `infermeter.usage.v1` for the caller's customer (`id` makes client retries idempotent).
- `GET /metrics` (Prometheus, serving/metrics.py), `GET /health`.

Errors always have the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

Usage capture: every request that passes authentication and body checks ends in exactly one
`infermeter.request.v1` event (ok, error, cancelled or rejected), built by
`serving.usage.build_request_event` and handed to the emitter (durable spool, then Kafka).
Requests refused before that (bad key 401, malformed body 400, unknown model 404) are not
inference requests and are not metered.

Streams: the gateway always asks vLLM for `stream_options: {include_usage: true,
continuous_usage_stats: true}` so that the tokens generated so far are known at every chunk, and
strips from what the client sees whatever it did not ask for (the usage-only final chunk, the
per-chunk usage). When the client disconnects mid-stream, the upstream connection is closed
(vLLM aborts the request) and the event says `cancelled` with the output tokens generated up to
then. Task tags: `X-Infermeter-Task-Id` and `X-Infermeter-Attempt` request headers.

Hot path notes: the two proxy routes are dispatched straight from the ASGI entry (`GatewayApp`:
no middleware stack, router scan or dependency solving); one keep-alive pool of upstream
connections (serving/upstream_http.py: httptools parsing, ~0.3-0.4 ms a request cheaper here than
aiohttp's client, which is itself ~7x cheaper than httpx, NOTES.md); raw bodies parsed with orjson;
no Pydantic models. A non-streamed request's event is built and spooled right after its response
is handed to the kernel, in the same event-loop step (`RequestContext.after_send`), not before.
Numbers: docs/benchmarks.md, "Gateway overhead".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import gc
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from infermeter.auth import AuthError, Principal, bearer_token, static_principal
from infermeter.settings import Settings, get_settings
from metering.contract import task_event, usage_event
from serving import metrics
from serving.routing import pick_replica
from serving.upstream_http import UpstreamConnectError, UpstreamError, UpstreamPool, UpstreamResponse
from serving.upstreams import ModelRoute, Replica, UpstreamConfig, load_upstreams
from serving.usage import RequestOutcome, build_request_event, usage_tokens

log = logging.getLogger("serving.gateway")

TASK_HEADER = "x-infermeter-task-id"
ATTEMPT_HEADER = "x-infermeter-attempt"
CUSTOMER_HEADER = "x-infermeter-customer-id"  # admin/producer tokens act for this customer
REQUEST_ID_HEADER = "x-request-id"
TASK_OUTCOMES = ("succeeded", "failed", "abandoned")
DEFAULT_CONTEXT_LENGTH = 8192
RECENT_TASKS_MAX = 200_000


# --- contracts with the control half (serving/keys.py, serving/emitter.py, serving/budgets.py) ---


class EventSink(Protocol):
    def emit(self, event: dict) -> None: ...


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Principal: ...


class AdmissionControl(Protocol):
    async def admit(
        self, customer_id: str, *, model: str, request_id: str, prompt_tokens: int, max_tokens: int
    ) -> Any: ...

    async def settle(self, request_id: str, **actual: Any) -> None: ...


class StaticAuthenticator:
    """Admin and producer tokens only (no key store configured)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def authenticate(self, token: str) -> Principal:
        principal = static_principal(token, self.settings.admin_token, self.settings.producer_token)
        if principal is None:
            raise AuthError("invalid API key")
        return principal


class MemorySink:
    """Keeps events in a list (embedding the gateway without Kafka, e.g. a local demo)."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, event: dict) -> None:
        self.events.append(event)


# --- errors -----------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def response(self) -> Response:
        return error_response(self.status, self.message, self.type, self.code, self.param, self.headers)


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})
    return Response(body, status_code=status, media_type="application/json", headers=headers)


# --- request body checks ---------------------------------------------------------------------

_INT = "integer"
_NUM = "number"
_BOOL = "boolean"
_STR = "string"
_OBJ = "object"
_COMMON_FIELDS = {
    "max_tokens": _INT,
    "max_completion_tokens": _INT,
    "n": _INT,
    "seed": _INT,
    "temperature": _NUM,
    "top_p": _NUM,
    "presence_penalty": _NUM,
    "frequency_penalty": _NUM,
    "stream": _BOOL,
    "stream_options": _OBJ,
    "user": _STR,
}
_CHAT_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    return isinstance(value, dict)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_request", param=param)


def parse_body(raw: bytes, kind: str) -> dict:
    """The request body as a dict, or ApiError(400) naming the first problem."""
    if not raw:
        raise _bad("the request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    for name, expected in _COMMON_FIELDS.items():
        value = body.get(name)
        if value is not None and not _type_ok(value, expected):
            raise _bad(f"'{name}' must be a {expected}", name)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and value < 1:
            raise _bad(f"'{name}' must be at least 1", name)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' is required and must be a non-empty list", "messages")
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _bad(f"messages[{index}] must be an object", f"messages[{index}]")
            if message.get("role") not in _CHAT_ROLES:
                raise _bad(
                    f"messages[{index}].role must be one of {sorted(_CHAT_ROLES)}", f"messages[{index}].role"
                )
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise _bad(
                    f"messages[{index}].content must be a string or a list of parts",
                    f"messages[{index}].content",
                )
    else:
        prompt = body.get("prompt")
        if not _prompt_ok(prompt):
            raise _bad("'prompt' is required: a string, a list of strings, or token ids", "prompt")
    return body


def _prompt_ok(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    if all(isinstance(p, str) for p in prompt):
        return True
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return True
    return all(
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    )


def prompt_token_bound(body: dict) -> int:
    """An upper bound of the prompt's tokens without tokenizing: one per UTF-8 byte (byte-level
    BPE never needs more), plus a few per chat message for the template. Used for reservations;
    settlement corrects to the real count."""
    prompt = body.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            return len(prompt.encode())
        total = 0
        for item in prompt:
            total += (
                len(item.encode()) if isinstance(item, str) else (len(item) if isinstance(item, list) else 1)
            )
        return total
    total = 0
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str):
            total += len(content.encode())
        elif isinstance(content, list):
            total += len(orjson.dumps(content))
        total += 8
    return total + 8


# --- per-request state ---------------------------------------------------------------------


@dataclass(slots=True)
class RequestContext:
    request_id: str
    principal: Principal
    customer_id: str
    kind: str  # chat | completion
    route: ModelRoute
    body: dict
    started_at: datetime
    started_mono: float
    task_id: str | None
    attempt: int
    replica: Replica | None = None
    holds_replica: bool = False  # counted in replica.in_flight
    finished: bool = False
    admitted: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)
    # The request's event, emitted by GatewayApp right after the response is handed to the client.
    after_send: Callable[[], Awaitable[None]] | None = None


@dataclass
class GatewayState:
    settings: Settings
    upstreams: UpstreamConfig
    sink: EventSink
    authenticator: Authenticator
    admission: AdmissionControl | None
    engine: Any  # SQLAlchemy engine (task ownership lookups), optional
    source: str
    upstream: UpstreamPool | None = None
    context_lengths: dict[str, int] = field(default_factory=dict)
    recent_tasks: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    emitted: int = 0


# --- the app ---------------------------------------------------------------------------------


class GatewayApp:
    """The ASGI app: the two proxy routes are dispatched here directly (no middleware stack, no
    router scan, no dependency solving: they are the hot path); everything else, lifespan
    included, goes to the FastAPI app. `.state` and `.fastapi` expose the FastAPI side."""

    _HOT = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}

    def __init__(self, fastapi_app: FastAPI, state: GatewayState) -> None:
        self.fastapi = fastapi_app
        self.gateway = state

    @property
    def state(self):
        return self.fastapi.state

    async def __call__(self, scope, receive, send) -> None:
        kind = self._HOT.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None or scope["method"] != "POST":
            await self.fastapi(scope, receive, send)
            return
        request = Request(scope, receive)
        ctx = None
        try:
            response, ctx = await _proxy(self.gateway, request, kind)
        except ApiError as exc:
            response = exc.response()
        except Exception:  # before the request had a usage record (auth store down, ...)
            log.exception("request failed before admission")
            response = error_response(
                500, "the gateway failed to serve this request", "api_error", "gateway_error"
            )
        try:
            await response(scope, receive, send)
        finally:
            # The event of a non-streamed request is built and spooled here, in the same event-loop
            # step that handed the response to the kernel (uvicorn's send does not yield): the
            # client is not kept waiting for it, and nothing else runs in between.
            if ctx is not None and ctx.after_send is not None:
                await ctx.after_send()


def create_app(
    settings: Settings | None = None,
    *,
    upstreams: UpstreamConfig | None = None,
    sink: EventSink | None = None,
    authenticator: Authenticator | None = None,
    admission: AdmissionControl | None = None,
    engine: Any = None,
    on_startup: Callable[[], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
) -> GatewayApp:
    """The gateway app. Every collaborator can be given; `build_gateway` wires the real ones."""
    settings = settings or get_settings()
    state = GatewayState(
        settings=settings,
        upstreams=upstreams or load_upstreams(settings.upstreams_file, default_routing=settings.routing),
        sink=sink or MemorySink(),
        authenticator=authenticator or StaticAuthenticator(settings),
        admission=admission,
        engine=engine,
        source=f"infermeter://gateway/{settings.gateway_id}",
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        # No total limit (a long stream is fine); a silent upstream fails after upstream_timeout_s.
        state.upstream = UpstreamPool(
            connect_timeout_s=settings.upstream_connect_timeout_s, read_timeout_s=settings.upstream_timeout_s
        )
        if on_startup is not None:
            await on_startup()
        # Everything alive now (~110k objects: modules, FastAPI, SQLAlchemy, the Kafka client)
        # lives as long as the process: keep it out of the cyclic GC's full collections, which
        # otherwise stop the event loop ~50 ms each, every few minutes at load (~2 ms frozen).
        gc.freeze()
        try:
            yield
        finally:
            await state.upstream.close()
            if on_shutdown is not None:
                await on_shutdown()

    app = FastAPI(
        title="infermeter gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = state

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), type_, code=str(exc.status_code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, str(exc.errors()), "invalid_request_error", code="invalid_request")

    async def proxy_method_not_allowed(request: Request) -> Response:  # GET etc. on the proxy paths
        return error_response(
            405, f"use POST for {request.url.path}", "invalid_request_error", "method_not_allowed"
        )

    app.router.add_route(
        "/v1/chat/completions", proxy_method_not_allowed, methods=["GET", "PUT", "DELETE", "PATCH"]
    )
    app.router.add_route(
        "/v1/completions", proxy_method_not_allowed, methods=["GET", "PUT", "DELETE", "PATCH"]
    )

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        await _authenticate(state, request)
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "infermeter",
                "root": route.deployment_id,
            }
            for name, route in state.upstreams.models.items()
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    @app.post("/v1/tasks/{task_id}/outcome")
    async def task_outcome(task_id: str, request: Request) -> Response:
        return await _task_outcome(state, task_id, request)

    @app.post("/v1/events")
    async def usage_event(request: Request) -> Response:
        return await _usage_event(state, request)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return GatewayApp(app, state)


# --- auth ------------------------------------------------------------------------------------


async def _authenticate(state: GatewayState, request: Request) -> Principal:
    try:
        token = bearer_token(request.headers.get("authorization"))
        return await state.authenticator.authenticate(token)
    except AuthError as exc:
        raise ApiError(401, str(exc), type_="authentication_error", code="invalid_api_key") from None


def _acting_customer(principal: Principal, request: Request, explicit: str | None = None) -> str:
    if principal.kind == "customer":
        return principal.customer_id or ""
    customer = explicit or request.headers.get(CUSTOMER_HEADER)
    if not customer:
        raise ApiError(
            400,
            f"admin and producer tokens must name the customer (header {CUSTOMER_HEADER.title()} or 'customer_id')",
            code="customer_required",
        )
    return customer


# --- the proxy -------------------------------------------------------------------------------


def _task_headers(request: Request) -> tuple[str | None, int]:
    task_id = request.headers.get(TASK_HEADER)
    attempt_raw = request.headers.get(ATTEMPT_HEADER)
    if task_id is not None and not (0 < len(task_id) <= 256):
        raise _bad(f"{TASK_HEADER} must be 1 to 256 characters")
    if attempt_raw is None:
        return task_id or None, 1
    try:
        attempt = int(attempt_raw)
    except ValueError:
        attempt = 0
    if not 1 <= attempt <= 1_000_000:
        raise _bad(f"{ATTEMPT_HEADER} must be an integer from 1 to 1000000")
    return task_id or None, attempt


async def _proxy(state: GatewayState, request: Request, kind: str) -> tuple[Response, RequestContext]:
    started_at = datetime.now(UTC)
    started_mono = time.perf_counter()
    principal = await _authenticate(state, request)
    customer_id = _acting_customer(principal, request)
    task_id, attempt = _task_headers(request)
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
        _remember_task(state, customer_id, task_id)
    try:
        return await _serve(state, ctx), ctx
    except Exception:  # a bug or a broken collaborator: still exactly one event, and an OpenAI error
        log.exception("request %s failed inside the gateway", ctx.request_id)
        if ctx.replica is not None and not ctx.finished:
            _release(ctx)
        await _finish(state, ctx, "error", tags={"error": "gateway_error"})
        return _with_headers(
            error_response(500, "the gateway failed to serve this request", "api_error", "gateway_error"), ctx
        ), ctx


async def _serve(state: GatewayState, ctx: RequestContext) -> Response:
    body = ctx.body
    route = ctx.route
    if state.admission is not None:
        try:
            rejected = await _admit(state, ctx)
        except Exception:
            log.exception("admission failed for %s", ctx.request_id)
            _finish_after_send(state, ctx, "error", tags={"error": "admission_unavailable"}, settle=False)
            return _with_headers(
                error_response(
                    503, "budgets and rate limits cannot be checked right now; retry shortly", "api_error",
                    "admission_unavailable",
                ),
                ctx,
            )  # fmt: skip
        if rejected is not None:
            return rejected

    stream = bool(body.get("stream"))
    payload = _upstream_payload(ctx, stream)
    try:
        response = await _open_upstream(state, ctx, payload)
    except ApiError as exc:
        _finish_after_send(state, ctx, "error", tags={"error": exc.code or "upstream"})
        return _with_headers(exc.response(), ctx)
    except BaseException:
        await _finish(state, ctx, "cancelled")
        raise

    if response.status != 200:
        try:
            data = await response.read()
        except (TimeoutError, UpstreamError):
            data = b""
        finally:
            response.release()
            _release(ctx)
        _finish_after_send(state, ctx, "error", tags={"error": f"upstream_{response.status}"})
        return _with_headers(_upstream_error(response.status, data), ctx)

    if stream:
        return MeteredStream(state, ctx, response)

    try:
        data = await response.read()
    except (TimeoutError, UpstreamError) as exc:
        _finish_after_send(state, ctx, "error", tags={"error": "upstream_broken"})
        return _with_headers(
            error_response(
                502, f"the upstream replica failed mid-response: {exc}", "api_error", "upstream_error"
            ),
            ctx,
        )
    except BaseException:
        await _finish(state, ctx, "cancelled")
        raise
    finally:
        response.release()
        _release(ctx)
    received_at = datetime.now(UTC)

    async def finish_ok() -> None:
        usage = None
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            usage = orjson.loads(data).get("usage")
        await _finish(
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
    return _with_headers(Response(data, media_type="application/json"), ctx)


def _release(ctx: RequestContext) -> None:
    if ctx.holds_replica:
        ctx.holds_replica = False
        ctx.replica.in_flight -= 1


def _with_headers(response: Response, ctx: RequestContext) -> Response:
    response.headers[REQUEST_ID_HEADER] = ctx.request_id
    for name, value in ctx.extra_headers.items():
        response.headers[name] = value
    return response


def _upstream_payload(ctx: RequestContext, stream: bool) -> bytes:
    body = ctx.body
    if stream:
        body = dict(body)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if ctx.route.upstream_model != ctx.route.name:
        body = dict(body)
        body["model"] = ctx.route.upstream_model
    return orjson.dumps(body)


async def _open_upstream(state: GatewayState, ctx: RequestContext, payload: bytes) -> UpstreamResponse:
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


def _upstream_error(status: int, data: bytes) -> Response:
    """vLLM's error passed through; rewrapped in the OpenAI shape if it is not already."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed["error"]
        return error_response(
            status,
            str(error.get("message", "")),
            "invalid_request_error" if 400 <= status < 500 else "api_error",
            None if error.get("code") is None else str(error.get("code")),
            error.get("param"),
        )
    message = data.decode(errors="replace")[:500] or f"upstream answered {status}"
    return error_response(status if status >= 400 else 502, message, "api_error", "upstream_error")


# --- admission (budgets and rate limits, serving/budgets.py) -----------------------------------


async def _admit(state: GatewayState, ctx: RequestContext) -> Response | None:
    body = ctx.body
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = await _context_length(state, ctx.route)
    max_tokens *= body.get("n") or 1
    result = await state.admission.admit(
        ctx.customer_id,
        model=ctx.route.name,
        request_id=ctx.request_id,
        prompt_tokens=prompt_token_bound(body),
        max_tokens=max_tokens,
    )
    headers = dict(getattr(result, "headers", None) or {})
    if hasattr(result, "openai_error"):  # a Rejection
        metrics.record_rejection(result.reason)
        _finish_after_send(state, ctx, "rejected", tags={"reason": result.reason}, settle=False)
        response = Response(
            orjson.dumps(result.openai_error()), status_code=result.status, media_type="application/json"
        )
        for name, value in headers.items():
            response.headers[name] = str(value)
        return _with_headers(response, ctx)
    ctx.admitted = bool(getattr(result, "limited", True))  # unlimited customers have nothing to settle
    ctx.extra_headers.update({name: str(value) for name, value in headers.items()})
    return None


async def _context_length(state: GatewayState, route: ModelRoute) -> int:
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


# --- finishing a request: the one event -------------------------------------------------------


def _finish_after_send(state: GatewayState, ctx: RequestContext, status: str, **details: Any) -> None:
    ctx.after_send = functools.partial(_finish, state, ctx, status, **details)


async def _finish(
    state: GatewayState,
    ctx: RequestContext,
    status: str,
    *,
    usage: dict | None = None,
    usage_final: bool = False,
    streamed_tokens: int = 0,
    first_token_at: datetime | None = None,
    finished_at: datetime | None = None,
    tags: dict[str, str] | None = None,
    settle: bool = True,
) -> None:
    """Emit the request's one event (idempotent per request), count it, settle its reservation."""
    if ctx.finished:
        return
    ctx.finished = True
    outcome = RequestOutcome(
        request_id=ctx.request_id,
        customer_id=ctx.customer_id,
        api_key_id=ctx.principal.api_key_id,
        model=ctx.route.name,
        deployment_id=ctx.route.deployment_id,
        replica_id=ctx.replica.replica_id if ctx.replica else None,
        status=status,
        started_at=ctx.started_at,
        finished_at=finished_at or datetime.now(UTC),
        first_token_at=first_token_at,
        usage=usage,
        usage_final=usage_final,
        streamed_tokens=streamed_tokens,
        task_id=ctx.task_id,
        attempt=ctx.attempt,
        tags=tags or {},
    )
    event = build_request_event(outcome, source=state.source)
    data = event["data"]
    try:
        state.sink.emit(event)
        state.emitted += 1
    except Exception:  # the spool itself failed: say so loudly, the response still goes out
        log.exception("could not spool the usage event of %s", ctx.request_id)
    metrics.record_request(
        ctx.route.name, status, data["input_tokens"], data["cached_input_tokens"], data["output_tokens"]
    )
    metrics.REQUEST_DURATION.labels(model=ctx.route.name).observe(time.perf_counter() - ctx.started_mono)
    if settle and ctx.admitted and state.admission is not None:
        try:
            await state.admission.settle(
                ctx.request_id,
                input_tokens=data["input_tokens"],
                cached_input_tokens=data["cached_input_tokens"],
                output_tokens=data["output_tokens"],
                event_source=event["source"],
                event_id=event["id"],
            )
        except Exception:
            log.exception("could not settle the reservation of %s", ctx.request_id)


# --- streaming -------------------------------------------------------------------------------


class MeteredStream(Response):
    """Relays vLLM's SSE stream chunk by chunk, tracking usage, and meters however it ends."""

    def __init__(self, state: GatewayState, ctx: RequestContext, upstream: UpstreamResponse) -> None:
        self.state = state
        self.ctx = ctx
        self.upstream = upstream
        self.status_code = 200
        options = ctx.body.get("stream_options") or {}
        self.client_usage = bool(options.get("include_usage"))
        self.client_continuous = self.client_usage and bool(options.get("continuous_usage_stats"))
        self.background = None
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            REQUEST_ID_HEADER: ctx.request_id,
            **ctx.extra_headers,
        }
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope, receive, send) -> None:  # noqa: C901 - one loop, every exit metered
        ctx = self.ctx
        task = asyncio.current_task()
        streaming = True
        disconnected = False

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if streaming:
                        disconnected = True
                        task.cancel()
                    return

        watcher = asyncio.create_task(watch_disconnect())
        usage: dict | None = None
        usage_final = False
        streamed = 0
        first_token_at: datetime | None = None
        status = "ok"
        tags: dict[str, str] = {}
        upstream_model = ctx.route.upstream_model.encode()
        rename = ctx.route.upstream_model != ctx.route.name
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for line in self.upstream.lines():
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].rstrip(b"\r\n")
                if payload == b"[DONE]":
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
                    break
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    status = "error"
                    tags["error"] = "upstream_stream_error"
                choices = chunk.get("choices")
                chunk_usage = chunk.get("usage")
                if chunk_usage:
                    usage = chunk_usage
                    if not choices:
                        usage_final = True
                if choices:
                    for choice in choices:
                        delta = choice.get("delta")
                        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                        if text or (
                            isinstance(delta, dict) and (delta.get("tool_calls") or delta.get("reasoning"))
                        ):
                            streamed += 1
                            if first_token_at is None:
                                first_token_at = datetime.now(UTC)
                    if chunk_usage is not None and not self.client_continuous:
                        del chunk["usage"]
                        payload = orjson.dumps(chunk)
                elif chunk_usage is not None and not self.client_usage:
                    continue  # the usage-only final chunk the client did not ask for
                if rename:
                    payload = payload.replace(
                        b'"model":"' + upstream_model + b'"', b'"model":"' + ctx.route.name.encode() + b'"', 1
                    )
                await send(
                    {"type": "http.response.body", "body": b"data: " + payload + b"\n\n", "more_body": True}
                )
            else:
                if status == "ok":  # the upstream closed without [DONE]
                    status = "error"
                    tags["error"] = "upstream_stream_truncated"
            streaming = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            streaming = False
            if not disconnected:
                status = "cancelled"
                tags["reason"] = "server_shutdown"
                raise
            task.uncancel()
            status = "cancelled"
            tags["reason"] = "client_disconnected"
        except OSError:  # the server could not write to the client: it is gone
            status = "cancelled"
            tags["reason"] = "client_disconnected"
        except (TimeoutError, UpstreamError) as exc:
            status = "error"
            tags["error"] = "upstream_broken"
            with contextlib.suppress(Exception):
                error = {
                    "error": {
                        "message": f"upstream failed mid-stream: {exc}",
                        "type": "api_error",
                        "param": None,
                        "code": "upstream_error",
                    }
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(error) + b"\n\n",
                        "more_body": False,
                    }
                )
        finally:
            streaming = False
            watcher.cancel()
            if status == "ok":
                self.upstream.release()
            else:
                self.upstream.close()  # drops the connection: vLLM aborts the request
            _release(ctx)
            await _finish(
                self.state,
                ctx,
                status,
                usage=usage,
                usage_final=usage_final,
                streamed_tokens=streamed,
                first_token_at=first_token_at,
                tags=tags,
            )


# --- tasks and tool usage ----------------------------------------------------------------------


def _remember_task(state: GatewayState, customer_id: str, task_id: str) -> None:
    key = (customer_id, task_id)
    tasks = state.recent_tasks
    if key in tasks:
        tasks.move_to_end(key)
        return
    tasks[key] = True
    if len(tasks) > RECENT_TASKS_MAX:
        tasks.popitem(last=False)


def _task_known_in_metering(engine: Any, customer_id: str, task_id: str) -> bool:
    from metering.queries import task_exists

    conn = engine.raw_connection()  # the pool's psycopg connection
    try:
        return task_exists(conn.driver_connection, customer_id, task_id)
    finally:
        conn.rollback()
        conn.close()


async def _read_json_object(request: Request) -> dict:
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _parse_time(value: Any, name: str) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if not isinstance(value, str):
        raise _bad(f"'{name}' must be an RFC 3339 timestamp", name)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _bad(f"'{name}' must be an RFC 3339 timestamp", name) from None
    if moment.tzinfo is None:
        raise _bad(f"'{name}' must carry a time zone offset", name)
    return moment.astimezone(UTC)


async def _task_outcome(state: GatewayState, task_id: str, request: Request) -> Response:
    principal = await _authenticate(state, request)
    body = await _read_json_object(request)
    customer_id = _acting_customer(principal, request, body.get("customer_id"))
    if principal.kind == "customer" and body.get("customer_id") not in (None, customer_id):
        raise ApiError(404, f"task '{task_id}' not found", type_="not_found_error", code="task_not_found")
    outcome = body.get("outcome")
    if outcome not in TASK_OUTCOMES:
        raise _bad(f"'outcome' must be one of {', '.join(TASK_OUTCOMES)}", "outcome")
    if not 0 < len(task_id) <= 256:
        raise _bad("the task id must be 1 to 256 characters")
    finished_at = _parse_time(body.get("finished_at"), "finished_at")
    known = (customer_id, task_id) in state.recent_tasks
    if not known and state.engine is not None:
        known = await asyncio.to_thread(_task_known_in_metering, state.engine, customer_id, task_id)
    if not known:  # unknown, or another customer's: the same answer, so existence is not disclosed
        raise ApiError(404, f"task '{task_id}' not found", type_="not_found_error", code="task_not_found")
    event_id = body.get("id") if isinstance(body.get("id"), str) and body.get("id") else None
    event = task_event(
        source=state.source,
        customer_id=customer_id,
        task_id=task_id,
        outcome=outcome,
        finished_at=finished_at,
        event_id=event_id,
    )
    state.sink.emit(event)
    payload = {"task_id": task_id, "customer_id": customer_id, "outcome": outcome, "event_id": event["id"]}
    return Response(orjson.dumps(payload), status_code=202, media_type="application/json")


async def _usage_event(state: GatewayState, request: Request) -> Response:
    principal = await _authenticate(state, request)
    body = await _read_json_object(request)
    customer_id = _acting_customer(principal, request, body.get("customer_id"))
    if principal.kind == "customer" and body.get("customer_id") not in (None, customer_id):
        raise ApiError(
            403, "a customer key may only report its own usage", type_="permission_error", code="forbidden"
        )
    meter = body.get("meter")
    if not isinstance(meter, str) or not meter:
        raise _bad("'meter' is required (e.g. 'tool_calls')", "meter")
    quantity_raw = body.get("quantity")
    if isinstance(quantity_raw, bool) or not isinstance(quantity_raw, str | int):
        raise _bad("'quantity' must be a decimal string or an integer", "quantity")
    try:
        quantity = Decimal(str(quantity_raw))
    except InvalidOperation:
        raise _bad("'quantity' must be a decimal string or an integer", "quantity") from None
    if not quantity.is_finite() or quantity < 0:
        raise _bad("'quantity' must be a non-negative decimal", "quantity")
    task_id = body.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise _bad("'task_id' must be a string", "task_id")
    event_id = body.get("id") if isinstance(body.get("id"), str) and body.get("id") else None
    try:
        event = usage_event(
            source=state.source,
            customer_id=customer_id,
            meter=meter,
            quantity=format(quantity, "f"),
            task_id=task_id,
            occurred_at=_parse_time(body.get("occurred_at"), "occurred_at"),
            event_id=event_id,
        )
        from metering.contract import decode_event, encode_event

        decode_event(encode_event(event), now=datetime.now(UTC), max_bytes=state.settings.max_event_bytes)
    except Exception as exc:  # InvalidEvent: say which field
        raise _bad(f"invalid usage event: {exc}") from None
    state.sink.emit(event)
    return Response(
        orjson.dumps({"event_id": event["id"], "customer_id": customer_id}),
        status_code=202,
        media_type="application/json",
    )


# --- wiring the real collaborators -------------------------------------------------------------


def build_gateway(settings: Settings | None = None, *, upstreams: UpstreamConfig | None = None) -> GatewayApp:
    """The gateway with its real collaborators: key store and admission on the database, the
    emitter (spool + Kafka). Used by `infermeter serve gateway`."""
    from infermeter.db import get_engine
    from infermeter.stack import resolve_database_url, running_stack

    settings = settings or get_settings()
    bootstrap = settings.kafka_bootstrap or (running_stack(settings) or {}).get("kafka_bootstrap")
    if not bootstrap:
        raise RuntimeError(
            "no Kafka to publish usage events to: set KAFKA_BOOTSTRAP or run `infermeter up` first"
        )
    engine = get_engine(resolve_database_url(settings))
    authenticator: Authenticator = StaticAuthenticator(settings)
    admission = None
    with contextlib.suppress(ImportError):
        from serving.keys import KeyStore

        authenticator = KeyStore(engine, settings)
    with contextlib.suppress(ImportError):
        from serving.budgets import AdmissionController

        admission = AdmissionController(engine, settings=settings)
    from serving.emitter import Emitter, default_spool_dir

    emitter = Emitter(default_spool_dir(settings), bootstrap, settings, name=settings.gateway_id)

    async def start() -> None:
        emitter.start()

    async def stop() -> None:
        await emitter.aclose()
        if admission is not None and hasattr(admission, "close"):
            await asyncio.to_thread(admission.close)

    app = create_app(
        settings,
        upstreams=upstreams,
        sink=emitter,
        authenticator=authenticator,
        admission=admission,
        engine=engine,
        on_startup=start,
        on_shutdown=stop,
    )
    app.state.emitter = emitter
    return app


@dataclasses.dataclass
class ServedApp:
    """An app served by uvicorn in a background thread (tests, replay, benchmarks)."""

    url: str
    app: Any
    server: Any
    thread: threading.Thread

    @property
    def state(self) -> GatewayState:
        return self.app.state.gateway

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int | None = None) -> ServedApp:
    import uvicorn

    from infermeter.stack import free_port

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", loop="uvloop", http="httptools")
    )
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the app did not start on {host}:{port}")
        time.sleep(0.02)
    return ServedApp(url=f"http://{host}:{port}", app=app, server=server, thread=thread)


__all__ = ["ApiError", "MemorySink", "build_gateway", "create_app", "parse_body", "usage_tokens"]
