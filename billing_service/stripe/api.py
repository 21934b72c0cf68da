"""`POST /v1/stripe/webhook`: Stripe's event deliveries (no bearer token: the signature is the credential).

Mount with `app.include_router(billing_service.stripe.api.router)`. It reads from `request.app.state`:
- `settings`: `stripe_webhook_secret` (INFERMETER_STRIPE_WEBHOOK_SECRET; unset -> 503);
- `stripe_status_port`: `on_status(invoice_id, status, at)` (billing_service.stripe.webhook.StatusPort);
- `stripe_webhook_events`: a WebhookEventLog (`PostgresWebhookEventLog(engine)` in the app);
- `clock` (optional): returns an aware UTC datetime; default the system clock.

Answers: 200 `{"received": true, "event_id", "outcome": applied|duplicate|ignored}`; 400 for a missing
or wrong signature or an old timestamp (`{"error": {"message", "code": "invalid_signature"}}` with
infermeter.http.error_handler installed), 400 `invalid_event` for a signed body that is not a Stripe event
of the shape read here (nothing recorded); 503 when not configured.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from billing_service.stripe.webhook import WebhookHandler, WebhookPayloadError, WebhookSignatureError, utc_now
from infermeter.http import error, error_responses

router = APIRouter(tags=["stripe"], responses=error_responses(400, 503))


@router.post("/v1/stripe/webhook")
async def stripe_webhook(request: Request) -> dict[str, Any]:
    state = request.app.state
    secret = getattr(state.settings, "stripe_webhook_secret", None)
    if not secret:
        raise error(503, "the Stripe webhook is not configured: set INFERMETER_STRIPE_WEBHOOK_SECRET", "not_configured")
    port = getattr(state, "stripe_status_port", None)
    events = getattr(state, "stripe_webhook_events", None)
    if port is None or events is None:
        raise error(503, "the Stripe webhook has no status port or event log (app.state)", "not_configured")
    handler = WebhookHandler(secret=secret, events=events, on_status=port, clock=getattr(state, "clock", utc_now))
    body = await request.body()
    try:
        result = await run_in_threadpool(handler.handle, body, request.headers.get("stripe-signature"))
    except WebhookPayloadError as exc:
        raise error(400, str(exc), "invalid_event") from None
    except WebhookSignatureError as exc:
        raise error(400, str(exc), "invalid_signature") from None
    out: dict[str, Any] = {"received": True, "event_id": result.event_id, "outcome": result.outcome}
    if result.invoice_id:
        out["invoice_id"] = result.invoice_id
    if result.status:
        out["status"] = str(result.status)
    if result.reason:
        out["reason"] = result.reason
    return out
