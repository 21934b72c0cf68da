"""The OpenAI-compatible gateway: auth, admission, routing, proxying to vLLM, usage capture.

`create_app(settings, ...)` builds the app with any collaborator given; `build_gateway` wires the
real ones; `infermeter serve gateway` runs it with uvicorn, `serve_in_thread` in a thread, both
with the gateway's own HTTP protocol (`http_protocol`: the proxy routes are answered without
uvicorn's ASGI request cycle, serving/gateway_http.py).

Endpoints
- `POST /v1/chat/completions`, `POST /v1/completions`: proxied to a vLLM replica of the model
  (serving/proxy.py, serving/upstreams.py, serving/routing.py), streaming (SSE) or not. Request
  bodies are checked (serving/openai_api.py: JSON object, field types; here: known model) and
  refused with 400/404 before anything reaches vLLM. Responses are vLLM's own bytes, except on
  streams (serving/relay.py).
- `GET /v1/models`: the models of the upstream file.
- `POST /v1/tasks/{task_id}/outcome` `{"outcome": "succeeded|failed|abandoned", "finished_at"?}`:
  emits `infermeter.task.v1`. A customer reports only on its own tasks: the task must have been
  seen with the caller's customer (on this gateway, or in metering's `task_attempts`), else 404.
- `POST /v1/events` `{"meter", "quantity", "task_id"?, "id"?}`: tool / verification usage as
  `infermeter.usage.v1` for the caller's customer (`id` makes client retries idempotent).
  Both in serving/task_endpoints.py.
- `GET /metrics` (Prometheus, serving/metrics.py; a scrape recomputes the capacity gauges from
  the database when they are INFERMETER_CAPACITY_REFRESH_S old, serving/capacity_service.py: no
  background task computes them), `GET /health`.

Errors always have the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

Failover (serving/proxy.py `open_upstream`, docs/serving.md "Failover"): a try that fails before
the client got a byte (refused, reset, silent, 5xx, 429) goes to another replica of the model, or
of its `fallback` model, up to INFERMETER_FAILOVER_ATTEMPTS tries; the failed replica's circuit
breaker opens for INFERMETER_BREAKER_COOLDOWN_S (serving/upstreams.py), then one request probes it.

Predictions at admission (serving/predictions.py): with a stored fit, every request is predicted
(output tokens p50/p90/p99, cached fraction, failure probability) by a lookup in the newest fit's
table, reloaded in a thread when a new version appears; the prediction rides on the request's
event (`prediction`), a `predictive` budget reserves its p99 (serving/budgets.py), and the capacity
signal counts it at arrival (serving/capacity_arrivals.py; the tally is flushed to the database
every 10 s by a worker thread, serving/capacity_arrivals_store.py, and summed over gateways).

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

Modules: serving/gateway_contracts.py (what the gateway asks of the key store, the emitter and
admission, and the admission results `Admitted | Rejected`), serving/openai_api.py (body checks,
OpenAI errors), serving/gateway_context.py (app state, request context, auth),
serving/proxy.py (proxy and admission), serving/relay.py (the one event, the SSE relay),
serving/task_endpoints.py, and this module (the ASGI app and its wiring).

Hot path notes: the two proxy routes are dispatched by the gateway's protocol at the end of their
headers (serving/gateway_http.py: no ASGI request cycle of uvicorn's; the status line, headers and
body of an answer in one write) straight to `GatewayApp.serve_proxy` (no middleware stack, router
scan or dependency solving; uvicorn without proxy-header rewriting);
the request is read through `ProxyRequest` (headers and body, no Starlette `Request`) and a
success answered with `JsonAnswer` (two ASGI messages, no header objects); one keep-alive pool of
upstream connections (serving/upstream_http.py: httptools parsing, one timer handle per wait, a
request in one coroutine); one keep-alive timer a client connection, not one a request;
raw bodies parsed with orjson; no Pydantic models; request ids from a seeded generator, not the
OS per request; the request metrics kept as plain numbers until scraped (serving/metrics.py). A
non-streamed request's event is built right after its response is handed to the kernel, in the
same event-loop step (`RequestContext.after_send`), not before; the emitter appends the events of
one loop iteration with one write (`Emitter.emit_batched`). Measurements: docs/benchmarks.md,
"Gateway overhead".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from infermeter.settings import Settings, get_settings
from serving import metrics
from serving.gateway_context import GatewayState, ProxyRequest, authenticate
from serving.gateway_contracts import (
    AdmissionControl,
    Authenticator,
    EventSink,
    MemorySink,
    StaticAuthenticator,
)
from serving.openai_api import ApiError, error_response
from serving.proxy import proxy
from serving.task_endpoints import post_task_outcome, post_usage_event
from serving.upstream_http import UpstreamPool
from serving.upstreams import UpstreamConfig, load_upstreams, parse_regions

log = logging.getLogger("serving.gateway")


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
        await self.serve_proxy(scope, receive, send, kind)

    async def serve_proxy(self, scope, receive, send, kind: str) -> None:
        """One request of a proxy route (`kind` chat or completion), from its ASGI scope, whether
        it came through uvicorn's request cycle (`__call__`) or the gateway's own protocol
        (serving/gateway_http.py)."""
        ctx = None
        try:
            response, ctx = await proxy(self.gateway, ProxyRequest(scope, receive), kind)
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
            # The event of a non-streamed request is built here, in the same event-loop step that
            # handed the response to the kernel (uvicorn's send does not yield): the client is not
            # kept waiting for it. The emitter spools it at the end of this loop iteration.
            if ctx is not None and (after_send := ctx.after_send) is not None:
                # It holds the context (a closure or partial over it): dropped first, the request's
                # objects form no cycle and are freed by reference counting, not by the cyclic GC.
                ctx.after_send = None
                await after_send()


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
    state.upstreams.apply_default_cooldown(settings.breaker_cooldown_s)  # models without down_for_s
    state.upstreams.check_regions(parse_regions(settings.regions, what="INFERMETER_REGIONS"))  # data residency

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
        await authenticate(state, request)
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
        return await post_task_outcome(state, task_id, request)

    @app.post("/v1/events")
    async def usage_event(request: Request) -> Response:
        return await post_usage_event(state, request)

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        refresher = getattr(request.app.state, "capacity_refresher", None)  # build_gateway's
        if refresher is not None:
            await refresher.refresh_if_stale()
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return GatewayApp(app, state)


# --- wiring the real collaborators -------------------------------------------------------------


def build_gateway(settings: Settings | None = None, *, upstreams: UpstreamConfig | None = None) -> GatewayApp:
    """The gateway with its real collaborators: key store and admission on the database, the
    emitter (spool + Kafka). Used by `infermeter serve gateway`."""
    from infermeter.db import get_engine
    from infermeter.stack.local import resolve_database_url, running_stack

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
    from serving.capacity_service import CapacityRefresher
    from serving.residency import ResidencyCache

    # each customer's regions, primed by the key lookup (serving/residency.py)
    residency = ResidencyCache(engine, settings.key_cache_ttl_s)
    if hasattr(authenticator, "residency"):
        authenticator.residency = residency
    if admission is not None and hasattr(authenticator, "admission"):
        authenticator.admission = admission  # the key lookup primes admission's no-limits entry

    # the capacity gauges on /metrics, recomputed from the database by a scrape that finds them
    # INFERMETER_CAPACITY_REFRESH_S old (no background task); what this gateway admits is counted in
    # memory and flushed to the database every 10 s by a worker thread, and before each refresh, so
    # that every reader sums the gateways' demand at arrival (serving/capacity_arrivals_store.py)
    from serving.capacity_arrivals import ArrivalDemand
    from serving.capacity_arrivals_store import ArrivalFlusher, new_gateway_instance

    arrivals = ArrivalDemand()
    flusher = ArrivalFlusher.on_engine(arrivals, engine, instance=new_gateway_instance(settings.gateway_id))
    refresher = CapacityRefresher(engine, settings, flusher=flusher)
    # every request predicted at admission from the newest stored fit, reloaded in a thread when a
    # new version appears (serving/predictions.py)
    from serving.predictions import AdmissionPredictor

    predictor = AdmissionPredictor.on_engine(engine)

    async def start() -> None:
        emitter.start()
        predictor.start()
        flusher.start()

    async def stop() -> None:
        await asyncio.to_thread(predictor.stop)
        await refresher.aclose()
        await asyncio.to_thread(flusher.stop)  # a last flush of this gateway's tally
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
    app.state.capacity_refresher = refresher
    app.gateway.residency = residency
    app.gateway.predictor = predictor
    app.gateway.arrivals = arrivals
    app.state.arrivals_flusher = flusher
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


def http_protocol(app: Any) -> Any:
    """What uvicorn serves `app` with: for the gateway, its own protocol (the proxy routes without
    uvicorn's ASGI request cycle, serving/gateway_http.py); for any other app, uvicorn's httptools."""
    if isinstance(app, GatewayApp):
        from serving.gateway_http import gateway_protocol

        return gateway_protocol(app)
    return "httptools"


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int | None = None) -> ServedApp:
    import uvicorn

    from infermeter.stack.ports import free_port

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", loop="uvloop", http=http_protocol(app),
                       proxy_headers=False)
    )
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the app did not start on {host}:{port}")
        time.sleep(0.02)
    return ServedApp(url=f"http://{host}:{port}", app=app, server=server, thread=thread)


__all__ = ["GatewayApp", "ServedApp", "build_gateway", "create_app", "http_protocol", "serve_in_thread"]
