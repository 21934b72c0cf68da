"""What every part of the gateway shares: its state, a request's context, and who is calling.

`GatewayState` is one per app (settings, upstreams, collaborators, the upstream connection pool);
`RequestContext` one per proxied request, from authentication to its one usage event.
`authenticate` turns the bearer token into a `Principal` (401 otherwise); `acting_customer` says
for which customer the request counts (admin and producer tokens must name one).
"""

from __future__ import annotations

import collections
import math
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import Request
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect

from infermeter.auth import AuthError, Principal, bearer_token
from infermeter.auth_backoff import FailedAuthentications
from infermeter.settings import Settings
from serving.capacity_arrivals import ArrivalDemand
from serving.gateway_contracts import AdmissionControl, Authenticator, EventSink
from serving.openai_api import ApiError
from serving.predictions import AdmissionPredictor, Prediction
from serving.prefix_memory import PrefixMemory
from serving.upstream_http import UpstreamPool
from serving.upstreams import ModelRoute, Replica, UpstreamConfig

TASK_HEADER = "x-infermeter-task-id"
TIMEOUT_HEADER = "x-infermeter-timeout-s"  # the client's deadline, seconds from receipt (failover)
ATTEMPT_HEADER = "x-infermeter-attempt"
CUSTOMER_HEADER = "x-infermeter-customer-id"  # admin/producer tokens act for this customer
REQUEST_ID_HEADER = "x-request-id"


# --- per-request state ---------------------------------------------------------------------


class RequestHeaders(Headers):
    """Starlette's `Headers` whose `get` looks the name up itself: the same answer (the first
    value, latin-1, names case-insensitive) without `Mapping.get` raising and catching a KeyError
    for each header the request does not carry (the task headers, usually)."""

    def get(self, key: str, default: Any = None) -> Any:
        wanted = key.lower().encode("latin-1")
        for name, value in self._list:
            if name == wanted:
                return value.decode("latin-1")
        return default


class ProxyRequest:
    """What the proxy routes read of a request: its headers and its body (the hot path's lighter
    stand-in for Starlette's `Request`, whose body is an async generator over `receive`)."""

    __slots__ = ("headers", "receive", "scope")

    def __init__(self, scope: dict, receive: Callable[[], Awaitable[dict]]) -> None:
        self.headers = RequestHeaders(scope=scope)
        self.receive = receive
        self.scope = scope

    async def body(self) -> bytes:
        chunks = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# Request ids: 128 random bits, as uuid4's 122, from a generator seeded from the OS once per process
# (uuid4 asks the OS for each); they name the request and its event, and are no secret.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_request_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{_ids.getrandbits(128):032x}"


@dataclass(slots=True)
class RequestContext:
    request_id: str
    principal: Principal
    customer_id: str
    kind: str  # chat | completion
    route: ModelRoute  # the model asked for; after a failover, the model of the replica tried last
    body: dict
    raw_body: bytes | None  # the body as the client sent it (forwarded as is when nothing changes)
    started_at: datetime
    started_mono: float
    task_id: str | None
    attempt: int
    headers: Any = None  # the request's headers (read only when a failover needs the deadline)
    replica: Replica | None = None  # the replica tried last (the one that served, on success)
    upstream_attempts: int = 0  # replicas tried (serving/proxy.py open_upstream)
    fallback_from: str | None = None  # the model asked for, when a fallback model's replica was tried
    excluded: frozenset[str] | None = None  # replicas outside the customer's regions (serving/residency.py)
    holds_replica: bool = False  # counted in replica.in_flight
    finished: bool = False
    admitted: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)
    # the prediction made at admission (serving/predictions.py); None without a fit
    prediction: Prediction | None = None
    prompt_bound: int | None = None  # prompt_token_bound(body), once computed (prediction, admission)
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
    residency: Any = None  # serving.residency.ResidencyCache (None: no database, no residency)
    context_lengths: dict[str, int] = field(default_factory=dict)
    recent_tasks: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    emitted: int = 0
    # prefix_seen on request events; from the settings by default (None: INFERMETER_PREFIX_MEMORY_ENTRIES=0)
    prefix_memory: PrefixMemory | None = None
    # the backoff on failed authentication, per client address (INFERMETER_AUTH_FAILURES_ALLOWED, ..._BACKOFF_MAX_S)
    failed_auth: FailedAuthentications | None = None
    # predictions at admission from the newest stored fit (serving/predictions.py); None: none made
    predictor: AdmissionPredictor | None = None
    # demand at arrival for the capacity signal (serving/capacity_arrivals.py); None: not counted
    arrivals: ArrivalDemand | None = None

    def __post_init__(self) -> None:
        if self.failed_auth is None:
            self.failed_auth = FailedAuthentications.of(self.settings)
        if self.prefix_memory is None and self.settings.prefix_memory_entries:
            self.prefix_memory = PrefixMemory.from_settings(self.settings)


# --- auth ------------------------------------------------------------------------------------


async def authenticate(state: GatewayState, request: Request | ProxyRequest) -> Principal:
    """The request's principal; a wrong key is 401 and counts as a failure of the client's address,
    which then waits (429, `Retry-After`) as `infermeter.auth_backoff` says, whatever key it sends."""
    failures = state.failed_auth
    if failures is not None and failures.any_failed:
        client = (request.scope.get("client") or ("unknown",))[0]
        wait = failures.wait_s(client)
        if wait > 0:
            retry_after = math.ceil(wait)
            raise ApiError(429, failures.message(retry_after), type_="rate_limit_error",
                           code="too_many_failed_authentications", headers={"Retry-After": str(retry_after)})
    try:
        token = bearer_token(request.headers.get("authorization"))
        return await state.authenticator.authenticate(token)
    except AuthError as exc:
        if failures is not None and failures.active:
            failures.failed((request.scope.get("client") or ("unknown",))[0])
        raise ApiError(401, str(exc), type_="authentication_error", code="invalid_api_key") from None


def acting_customer(principal: Principal, request: Request | ProxyRequest, explicit: str | None = None) -> str:
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
