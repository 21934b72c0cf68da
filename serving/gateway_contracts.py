"""What the gateway asks of its collaborators, and the stand-ins it uses when none is given.

The real collaborators live in the control half: the key store (serving/keys.py) is an
`Authenticator`, the emitter (serving/emitter.py) an `EventSink`, the admission controller
(serving/budgets.py) an `AdmissionControl`. `admit` answers `Admitted | Rejected`, the two
result types defined here so that the gateway and the controller share them.

Without a key store, `StaticAuthenticator` accepts the admin and producer tokens only; without
an emitter, `MemorySink` keeps the events in a list (embedding the gateway without Kafka).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, Protocol

from infermeter.auth import AuthError, Principal, static_principal
from infermeter.settings import Settings

RejectionReason = Literal["budget_exceeded", "rate_limit_requests", "rate_limit_tokens"]


# --- admission results -------------------------------------------------------------------------


@dataclass(frozen=True)
class Admitted:
    """Forward the request; add `headers` (e.g. the soft-mode budget warning) to its response."""

    request_id: str
    customer_id: str
    reserved: Decimal = Decimal(0)
    warning: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    limited: bool = False  # False: the customer has no budget row (nothing to settle)


@dataclass(frozen=True)
class Rejected:
    """Answer `status` with `openai_error()` as the body and `headers` (Retry-After on 429)."""

    reason: RejectionReason
    message: str
    status: int
    error_type: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)

    def openai_error(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": None, "code": self.code}}


# --- protocols ---------------------------------------------------------------------------------


class EventSink(Protocol):
    """`emit` keeps the event before it returns. A sink may also have `emit_batched(event)`, which
    may keep it with the rest of the event-loop iteration's events instead (the emitter's spool
    transaction); the gateway uses it for request events, whose client already has its answer."""

    def emit(self, event: dict) -> None: ...


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Principal: ...


class AdmissionControl(Protocol):
    async def admit(
        self, customer_id: str, *, model: str, request_id: str, prompt_tokens: int, max_tokens: int,
        predicted_output_tokens: int | None = None,
    ) -> Admitted | Rejected: ...

    async def settle(self, request_id: str, **actual: Any) -> None: ...


# --- stand-ins ---------------------------------------------------------------------------------


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
