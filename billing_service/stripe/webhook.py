"""Stripe webhooks: verify the signature, take each event once, report invoice status changes.

Signature (Stripe's scheme v1): the `Stripe-Signature` header is `t=<unix seconds>,v1=<hex>[,v1=<hex>...]`
(other schemes such as v0 may appear and are ignored); v1 is the HMAC-SHA256, keyed with the endpoint's
signing secret, of `"<t>.<raw request body>"`. An event is accepted when one v1 signature matches
(constant-time compare) and `t` is within `tolerance_s` (default 300 s) of the injected clock. This is
what `stripe.WebhookSignature.verify_header` does, except that it reads `time.time()` itself and only
refuses old timestamps; here the clock is injected and a timestamp too far in the future is refused
too. Headers made by `stripe.WebhookSignature.generate_signature_header` verify here (a test checks it).

Events (`invoice.paid` -> paid, `invoice.payment_failed` -> payment_failed, `invoice.voided` -> void)
become `on_status(invoice_id, status, at)` calls, with the infermeter invoice id from the Stripe
invoice's `metadata.infermeter_invoice_id` and `at` the event's `created` time. Every verified event is
recorded by id in a `WebhookEventLog` in the same step: a replayed event (same id) has no second effect.
If `on_status` raises, the event is not recorded (the endpoint answers 500 and Stripe redelivers it);
if it raises a `billing.errors.BillingError` (say paid -> payment_failed, delivered out of order) the
event is recorded as ignored, so Stripe stops redelivering something that can never apply.
A signed body of another shape (`data`, `data.object` or its `metadata` not an object, the invoice id not
a string) raises WebhookPayloadError (400 `invalid_event`) before anything is recorded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from billing.errors import BillingError
from billing.invoice import InvoiceStatus
from billing_service.stripe.state import WebhookEventLog
from infermeter.times import utc_now

DEFAULT_TOLERANCE_S = 300
STATUS_BY_EVENT: dict[str, InvoiceStatus] = {
    "invoice.paid": InvoiceStatus.PAID,
    "invoice.payment_failed": InvoiceStatus.PAYMENT_FAILED,
    "invoice.voided": InvoiceStatus.VOID,
}
META_INVOICE = "infermeter_invoice_id"


class WebhookSignatureError(ValueError):
    """The request is not a verified Stripe event: answer 400."""


class WebhookPayloadError(WebhookSignatureError):
    """The body is signed, but is not a Stripe event of the shape this endpoint reads: answer 400
    (`invalid_event`). Raised before the event is recorded, so it changes nothing."""


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


@dataclass(frozen=True)
class InvoiceReference:
    """What a verified event says about an invoice: the Stripe invoice, the infermeter invoice (or None)."""

    stripe_invoice_id: object
    invoice_id: str | None


def read_invoice_reference(event: dict[str, Any]) -> InvoiceReference:
    """`data.object.id` and `data.object.metadata.infermeter_invoice_id`, their shape checked: objects where
    Stripe sends objects, a string invoice id; WebhookPayloadError names the first field that is not."""
    event_id = event["id"]

    def wrong(field: str, value: object, expected: str) -> WebhookPayloadError:
        return WebhookPayloadError(f"event {event_id}: '{field}' is {_json_kind(value)}, not {expected}")

    data = event.get("data")
    if not isinstance(data, dict):
        raise wrong("data", data, "an object")
    obj = data.get("object")
    if not isinstance(obj, dict):
        raise wrong("data.object", obj, "an object")
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise wrong("data.object.metadata", metadata, "an object")
    invoice_id = metadata.get(META_INVOICE)
    if invoice_id is not None and not isinstance(invoice_id, str):
        raise wrong(f"data.object.metadata.{META_INVOICE}", invoice_id, "a string")
    return InvoiceReference(obj.get("id"), invoice_id or None)


class StatusPort(Protocol):
    def __call__(self, invoice_id: str, status: InvoiceStatus, at: datetime) -> None:
        """Move the local invoice to `status` at `at`. Called at most once per event id, but possibly twice
        for one (invoice, status) if Stripe sends two events for it: a repeat should be a no-op."""
        ...


def sign(payload: bytes | str, secret: str, timestamp: int) -> str:
    """A `Stripe-Signature` header for `payload` (tests, local tools)."""
    body = payload.encode() if isinstance(payload, str) else payload
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_signature(
    payload: bytes | str, header: str | None, secret: str, *, now: datetime, tolerance_s: int = DEFAULT_TOLERANCE_S
) -> int:
    """The header's timestamp if `payload` is signed with `secret` within the tolerance; else WebhookSignatureError."""
    if not secret:
        raise WebhookSignatureError("no webhook signing secret is configured (INFERMETER_STRIPE_WEBHOOK_SECRET)")
    if not header:
        raise WebhookSignatureError("missing Stripe-Signature header")
    body = payload.encode() if isinstance(payload, str) else bytes(payload)
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookSignatureError("Stripe-Signature timestamp is not an integer") from None
        elif name == "v1":
            signatures.append(value)
    if timestamp is None:
        raise WebhookSignatureError("Stripe-Signature has no timestamp (t=...)")
    if not signatures:
        raise WebhookSignatureError("Stripe-Signature has no v1 signature")
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise WebhookSignatureError("no v1 signature matches the payload and the signing secret")
    age = now.timestamp() - timestamp
    if abs(age) > tolerance_s:
        raise WebhookSignatureError(
            f"Stripe-Signature timestamp is {age:+.0f} s from now, outside the {tolerance_s} s tolerance "
            f"(a replayed or delayed request, or a wrong clock)"
        )
    return timestamp


@dataclass(frozen=True)
class WebhookResult:
    event_id: str
    type: str
    outcome: str  # applied | duplicate | ignored
    invoice_id: str | None = None
    status: InvoiceStatus | None = None
    reason: str | None = None


class WebhookHandler:
    def __init__(
        self,
        *,
        secret: str,
        events: WebhookEventLog,
        on_status: StatusPort,
        clock: Callable[[], datetime] = utc_now,
        tolerance_s: int = DEFAULT_TOLERANCE_S,
    ) -> None:
        self.secret = secret
        self.events = events
        self.on_status = on_status
        self.clock = clock
        self.tolerance_s = tolerance_s

    def handle(self, payload: bytes, signature: str | None) -> WebhookResult:
        now = self.clock()
        verify_signature(payload, signature, self.secret, now=now, tolerance_s=self.tolerance_s)
        try:
            event = json.loads(payload)
        except ValueError:
            raise WebhookPayloadError("the signed payload is not JSON") from None
        if not isinstance(event, dict) or event.get("object") != "event" or not isinstance(event.get("id"), str):
            raise WebhookPayloadError("the payload is not a Stripe event (object 'event' with an id)")
        event_id, type_ = event["id"], str(event.get("type", ""))
        reference = read_invoice_reference(event)  # before the event is recorded: a refused body changes nothing
        with self.events.claim(event_id, type_, event, now) as first:
            if not first:
                return WebhookResult(event_id, type_, "duplicate")
            return self._apply(event, event_id, type_, reference)

    def _apply(self, event: dict[str, Any], event_id: str, type_: str, reference: InvoiceReference) -> WebhookResult:
        status = STATUS_BY_EVENT.get(type_)
        if status is None:
            return WebhookResult(event_id, type_, "ignored", reason=f"event type {type_} is not handled")
        invoice_id = reference.invoice_id
        if invoice_id is None:
            return WebhookResult(event_id, type_, "ignored", reason=(
                f"Stripe invoice {reference.stripe_invoice_id} has no metadata.{META_INVOICE}"))
        created = event.get("created")
        if not isinstance(created, int):
            raise WebhookPayloadError("the event has no integer 'created' time")
        at = datetime.fromtimestamp(created, UTC)
        try:
            self.on_status(invoice_id, status, at)
        except BillingError as exc:
            return WebhookResult(event_id, type_, "ignored", invoice_id, status, reason=str(exc))
        return WebhookResult(event_id, type_, "applied", invoice_id, status)
