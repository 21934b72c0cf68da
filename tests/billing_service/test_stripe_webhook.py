"""Stripe webhooks: signatures (v1, tolerance, injected clock), status changes, replays, the FastAPI route."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
import stripe
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from billing.errors import InvoiceStateError
from billing.invoice import InvoiceStatus
from billing_service.stripe.api import router
from billing_service.stripe.state import InMemoryWebhookEventLog, PostgresWebhookEventLog
from billing_service.stripe.webhook import (
    WebhookHandler,
    WebhookSignatureError,
    sign,
    verify_signature,
)
from infermeter.http import error_handler
from infermeter.settings import Settings

pytest_plugins = ["tests.billing_service.conftest_stripe"]

SECRET = "whsec_test_secret"
NOW = datetime(2026, 3, 9, 12, tzinfo=UTC)


def event(type_: str = "invoice.paid", *, event_id: str = "evt_1", invoice_id: str | None = "inv_abc",
          created: datetime = NOW - timedelta(seconds=30)) -> bytes:
    metadata = {"infermeter_invoice_id": invoice_id} if invoice_id else {}
    return json.dumps({
        "id": event_id, "object": "event", "type": type_, "created": int(created.timestamp()), "livemode": False,
        "data": {"object": {"id": "in_123", "object": "invoice", "status": "paid", "metadata": metadata}},
    }).encode()


def signed(payload: bytes, at: datetime = NOW, secret: str = SECRET) -> str:
    return sign(payload, secret, int(at.timestamp()))


class Recorder:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[str, InvoiceStatus, datetime]] = []
        self.fail = fail

    def __call__(self, invoice_id: str, status: InvoiceStatus, at: datetime) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append((invoice_id, status, at))


def handler(port=None, events=None, clock=lambda: NOW) -> WebhookHandler:
    return WebhookHandler(secret=SECRET, events=events or InMemoryWebhookEventLog(), on_status=port or Recorder(),
                          clock=clock)


# ---------------------------------------------------------------- signatures


def test_a_valid_signature_passes_and_agrees_with_stripe_python():
    payload = event()
    ts = int(NOW.timestamp())
    assert verify_signature(payload, signed(payload), SECRET, now=NOW) == ts
    theirs = stripe.WebhookSignature.generate_signature_header(payload.decode(), SECRET, timestamp=ts)
    assert theirs == signed(payload)
    assert verify_signature(payload, theirs, SECRET, now=NOW) == ts
    real_now = datetime.now(UTC)
    ours = sign(payload, SECRET, int(real_now.timestamp()))
    assert stripe.WebhookSignature.verify_header(payload.decode(), ours, SECRET, tolerance=300)


def test_several_signatures_and_other_schemes():
    payload = event()
    good = signed(payload).split(",")[1]
    header = f"t={int(NOW.timestamp())},v0=deadbeef,v1={'0' * 64},{good}"
    assert verify_signature(payload, header, SECRET, now=NOW)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing"),
        ("", "missing"),
        ("v1=abc", "no timestamp"),
        ("t=abc,v1=abc", "not an integer"),
        (f"t={int(NOW.timestamp())}", "no v1"),
        (f"t={int(NOW.timestamp())},v0=abc", "no v1"),
    ],
)
def test_malformed_headers_are_refused(header, message):
    with pytest.raises(WebhookSignatureError, match=message):
        verify_signature(event(), header, SECRET, now=NOW)


def test_a_wrong_signature_is_refused():
    payload = event()
    with pytest.raises(WebhookSignatureError, match="no v1 signature matches"):
        verify_signature(payload, signed(payload, secret="whsec_other"), SECRET, now=NOW)
    with pytest.raises(WebhookSignatureError, match="no v1 signature matches"):  # body changed after signing
        verify_signature(payload.replace(b"invoice.paid", b"invoice.voided"), signed(payload), SECRET, now=NOW)


def test_timestamps_outside_the_tolerance_are_refused():
    payload = event()
    assert verify_signature(payload, signed(payload, NOW - timedelta(seconds=300)), SECRET, now=NOW)
    with pytest.raises(WebhookSignatureError, match="outside the 300 s tolerance"):
        verify_signature(payload, signed(payload, NOW - timedelta(seconds=301)), SECRET, now=NOW)
    with pytest.raises(WebhookSignatureError, match="outside"):
        verify_signature(payload, signed(payload, NOW + timedelta(seconds=301)), SECRET, now=NOW)
    with pytest.raises(WebhookSignatureError, match="outside the 60 s"):
        verify_signature(payload, signed(payload, NOW - timedelta(seconds=61)), SECRET, now=NOW, tolerance_s=60)


# ---------------------------------------------------------------- events


@pytest.mark.parametrize(
    ("type_", "status"),
    [("invoice.paid", InvoiceStatus.PAID), ("invoice.payment_failed", InvoiceStatus.PAYMENT_FAILED),
     ("invoice.voided", InvoiceStatus.VOID)],
)
def test_invoice_events_become_status_changes(type_, status):
    port = Recorder()
    payload = event(type_)
    result = handler(port).handle(payload, signed(payload))
    assert (result.outcome, result.invoice_id, result.status) == ("applied", "inv_abc", status)
    assert port.calls == [("inv_abc", status, NOW - timedelta(seconds=30))]


def test_a_replayed_event_has_no_second_effect():
    port, events = Recorder(), InMemoryWebhookEventLog()
    payload = event()
    first = handler(port, events).handle(payload, signed(payload))
    later = NOW + timedelta(seconds=100)
    again = handler(port, events, clock=lambda: later).handle(payload, signed(payload, later))  # re-signed
    assert (first.outcome, again.outcome) == ("applied", "duplicate")
    assert len(port.calls) == 1 and list(events.events) == ["evt_1"]


def test_concurrent_deliveries_of_one_event_apply_once():
    port, events = Recorder(), InMemoryWebhookEventLog()
    payload = event()
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda: outcomes.append(handler(port, events).handle(payload, signed(payload))
                                                               .outcome)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["applied"] + ["duplicate"] * 7 and len(port.calls) == 1


def test_other_events_and_foreign_invoices_are_recorded_and_ignored():
    port, events = Recorder(), InMemoryWebhookEventLog()
    payload = event("customer.created", event_id="evt_2")
    assert handler(port, events).handle(payload, signed(payload)).outcome == "ignored"
    payload = event(event_id="evt_3", invoice_id=None)
    result = handler(port, events).handle(payload, signed(payload))
    assert result.outcome == "ignored" and "no metadata" in result.reason
    assert port.calls == [] and set(events.events) == {"evt_2", "evt_3"}


def test_a_status_the_invoice_cannot_take_is_ignored_but_recorded():
    events = InMemoryWebhookEventLog()
    port = Recorder(fail=InvoiceStateError("invoice inv_abc cannot go from paid to payment_failed"))
    payload = event("invoice.payment_failed")
    result = handler(port, events).handle(payload, signed(payload))
    assert result.outcome == "ignored" and "cannot go from paid" in result.reason
    assert "evt_1" in events.events


def test_when_the_port_fails_the_event_is_not_taken_and_a_redelivery_applies_it():
    events = InMemoryWebhookEventLog()
    payload = event()
    with pytest.raises(RuntimeError):
        handler(Recorder(fail=RuntimeError("database down")), events).handle(payload, signed(payload))
    assert events.events == {}
    port = Recorder()
    assert handler(port, events).handle(payload, signed(payload)).outcome == "applied"
    assert len(port.calls) == 1


def test_a_signed_body_that_is_not_an_event_is_refused():
    for payload in (b"not json", b'{"object": "invoice", "id": "in_1"}'):
        with pytest.raises(WebhookSignatureError):
            handler().handle(payload, signed(payload))


def test_postgres_event_log_replays_and_failures(stripe_pg_engine):
    events = PostgresWebhookEventLog(stripe_pg_engine)
    port = Recorder()
    payload = event()
    assert handler(port, events).handle(payload, signed(payload)).outcome == "applied"
    assert handler(port, events).handle(payload, signed(payload)).outcome == "duplicate"
    assert len(port.calls) == 1 and events.seen("evt_1")
    other = event(event_id="evt_9")
    with pytest.raises(RuntimeError):
        handler(Recorder(fail=RuntimeError("boom")), events).handle(other, signed(other))
    assert not events.seen("evt_9")  # rolled back: a redelivery is processed
    assert handler(port, events).handle(other, signed(other)).outcome == "applied"
    with stripe_pg_engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT event_id, type, payload->>'type' FROM stripe_webhook_events "
                                    "ORDER BY event_id").all()
    assert [tuple(r) for r in rows] == [("evt_1", "invoice.paid", "invoice.paid"), ("evt_9", "invoice.paid", "invoice.paid")]


def test_postgres_event_log_concurrent_deliveries_apply_once(stripe_pg_engine):
    events = PostgresWebhookEventLog(stripe_pg_engine)
    port = Recorder()
    payload = event(event_id="evt_c")
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda: outcomes.append(handler(port, events).handle(payload, signed(payload))
                                                               .outcome)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["applied"] + ["duplicate"] * 3 and len(port.calls) == 1


# ---------------------------------------------------------------- the route


def app_with(secret: str | None = SECRET, port=None, events=None) -> tuple[TestClient, Recorder]:
    app = FastAPI()
    app.add_exception_handler(HTTPException, error_handler)
    app.include_router(router)
    app.state.settings = Settings(INFERMETER_STRIPE_WEBHOOK_SECRET=secret) if secret else Settings()
    port = port or Recorder()
    app.state.stripe_status_port = port
    app.state.stripe_webhook_events = events or InMemoryWebhookEventLog()
    app.state.clock = lambda: NOW
    return TestClient(app), port


def test_route_applies_a_signed_event_once():
    client, port = app_with()
    payload = event("invoice.voided")
    first = client.post("/v1/stripe/webhook", content=payload, headers={"Stripe-Signature": signed(payload)})
    assert first.status_code == 200
    assert first.json() == {"received": True, "event_id": "evt_1", "outcome": "applied", "invoice_id": "inv_abc",
                            "status": "void"}
    again = client.post("/v1/stripe/webhook", content=payload, headers={"Stripe-Signature": signed(payload)})
    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert len(port.calls) == 1


def test_route_rejects_a_bad_signature_and_an_old_timestamp_with_400():
    client, port = app_with()
    payload = event()
    bad = client.post("/v1/stripe/webhook", content=payload,
                      headers={"Stripe-Signature": signed(payload, secret="whsec_wrong")})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_signature"
    old = client.post("/v1/stripe/webhook", content=payload,
                      headers={"Stripe-Signature": signed(payload, NOW - timedelta(minutes=6))})
    assert old.status_code == 400 and "tolerance" in old.json()["error"]["message"]
    missing = client.post("/v1/stripe/webhook", content=payload)
    assert missing.status_code == 400
    assert port.calls == []


def test_route_without_a_secret_answers_503(monkeypatch):
    monkeypatch.delenv("INFERMETER_STRIPE_WEBHOOK_SECRET", raising=False)
    client, port = app_with(secret=None)
    payload = event()
    response = client.post("/v1/stripe/webhook", content=payload, headers={"Stripe-Signature": signed(payload)})
    assert response.status_code == 503 and "INFERMETER_STRIPE_WEBHOOK_SECRET" in response.json()["error"]["message"]
    assert port.calls == []


def test_settings_read_the_stripe_variables(monkeypatch):
    monkeypatch.setenv("INFERMETER_STRIPE_API_KEY", "sk_test_1")
    monkeypatch.setenv("INFERMETER_STRIPE_API_BASE", "http://127.0.0.1:1")
    monkeypatch.setenv("INFERMETER_STRIPE_WEBHOOK_SECRET", "whsec_1")
    settings = Settings()
    assert (settings.stripe_api_key, settings.stripe_api_base, settings.stripe_webhook_secret) == (
        "sk_test_1", "http://127.0.0.1:1", "whsec_1")


# ---------------------------------------------------------------- signed but odd bodies


def odd_event(*, data=None, metadata=None, invoice_id=None) -> bytes:
    """A signed `invoice.paid` whose `data`, `metadata` or `metadata.infermeter_invoice_id` is replaced."""
    body = json.loads(event(event_id="evt_odd"))
    if invoice_id is not None:
        body["data"]["object"]["metadata"]["infermeter_invoice_id"] = invoice_id
    if metadata is not None:
        body["data"]["object"]["metadata"] = metadata
    if data is not None:
        body["data"] = data
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (odd_event(data=[{"object": {"id": "in_123"}}]), "'data' is a list, not an object"),
        (odd_event(data={"object": ["in_123"]}), "'data.object' is a list, not an object"),
        (odd_event(metadata=[["infermeter_invoice_id", "inv_abc"]]),
         "'data.object.metadata' is a list, not an object"),
        (odd_event(invoice_id=42), "'data.object.metadata.infermeter_invoice_id' is a number, not a string"),
    ],
    ids=["data-list", "object-list", "metadata-list", "invoice-id-number"],
)
def test_route_refuses_a_signed_body_of_the_wrong_shape_with_400_and_changes_nothing(payload, reason):
    events = InMemoryWebhookEventLog()
    client, port = app_with(events=events)
    response = client.post("/v1/stripe/webhook", content=payload, headers={"Stripe-Signature": signed(payload)})
    assert response.status_code == 400
    assert response.json() == {"error": {"message": f"event evt_odd: {reason}", "code": "invalid_event"}}
    assert port.calls == [] and events.events == {}


def test_a_signed_body_of_the_wrong_shape_records_nothing_in_postgres(stripe_pg_engine):
    events = PostgresWebhookEventLog(stripe_pg_engine)
    port = Recorder()
    for payload in (odd_event(data=["x"]), odd_event(metadata=["x"]), odd_event(invoice_id=7)):
        with pytest.raises(WebhookSignatureError, match="^event evt_odd: "):
            handler(port, events).handle(payload, signed(payload))
    assert port.calls == [] and not events.seen("evt_odd")
