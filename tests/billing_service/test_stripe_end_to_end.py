"""Stripe end to end, on the real embedded PostgreSQL and the strict fake Stripe server:

a billing run finalizes invoices, `infermeter stripe sync` pushes them (a rerun creates nothing, a crash
after any Stripe call then a rerun creates no duplicate), `stripe status` tells what is in sync, and a
signed `invoice.paid` webhook posted to the app marks the local invoice paid (a replay has no second
effect, a bad signature is a 400); `invoice.voided` voids and reissues like `invoices void`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.errors import InvoiceStateError
from billing.invoice import InvoiceStatus
from billing_service.invoices import record_payment_status, show_invoice
from billing_service.run import billing_run
from billing_service.stripe.run import sync_invoices
from billing_service.stripe.state import PostgresSyncState
from billing_service.stripe.sync import StripeSync, item_specs
from billing_service.stripe.webhook import sign
from tests.billing_service.conftest import cost_model

pytest_plugins = ["tests.billing_service.conftest_stripe"]

SECRET = "whsec_end_to_end"
APRIL_AFTER_GRACE = datetime(2026, 4, 2, 1, tzinfo=UTC)


@pytest.fixture
def two_invoices(conn, metering, february, cli):
    """acme (with an e-mail) has February (INV-2026-000001) and March (INV-2026-000002) finalized."""
    assert cli("customers", "set", "acme", "--name", "Acme", "--email", "billing@acme.test").code == 0
    metering.request("acme", datetime(2026, 3, 5, tzinfo=UTC), input_tokens=700_000, output=20_000)
    [march] = billing_run(conn, "2026-03", now=APRIL_AFTER_GRACE, cost_model=cost_model()).invoices
    assert (march.status, march.number) == ("open", "INV-2026-000002")
    return february, march


def stripe_objects(conn) -> list[tuple]:
    return conn.execute("SELECT kind, local_id, stripe_id FROM stripe_objects ORDER BY 1, 2").fetchall()


def assert_in_stripe_once(fake, api_key, conn, invoices, statuses):
    """One customer; per invoice one Stripe invoice (its number, status, total) and one item per line."""
    assert fake.count(api_key, "customer") == 1
    stripe_invoices = {i["metadata"]["infermeter_invoice_id"]: i for i in fake.list_objects(api_key, "invoice")}
    assert len(stripe_invoices) == len(fake.list_objects(api_key, "invoice")) == len(invoices)
    items = fake.list_objects(api_key, "invoiceitem")
    for invoice_id, status in zip(invoices, statuses, strict=True):
        inv = show_invoice(conn, invoice_id)
        theirs = stripe_invoices[invoice_id]
        assert (theirs["number"], theirs["status"]) == (inv["number"], status)
        mine = [i for i in items if i["metadata"]["infermeter_invoice_id"] == invoice_id]
        assert all(i["invoice"] == theirs["id"] for i in mine)
        assert sum(i["amount"] for i in mine) == int(Decimal(inv["total"]) * 100)
        assert sorted(i["metadata"]["infermeter_line_id"] for i in mine) == sorted(line["id"] for line in inv["lines"])
    assert len(items) == sum(len(show_invoice(conn, i)["lines"]) for i in invoices)


# ---------------------------------------------------------------- stripe sync / status


def test_stripe_sync_pushes_finalized_invoices_oldest_first_and_a_rerun_creates_nothing(
        conn, two_invoices, cli, stripe_env, stripe_fake):
    feb, mar = two_invoices
    before = cli("stripe", "status", "--json")
    assert before.code == 0, before.err
    assert [(i["number"], i["in_sync"], i["note"]) for i in before.json()["invoices"]] == [
        ("INV-2026-000001", False, "not pushed yet"), ("INV-2026-000002", False, "not pushed yet")]

    first_request = len(stripe_fake.requests)
    pushed = cli("stripe", "sync", "--json")
    assert pushed.code == 0, pushed.out + pushed.err
    report = pushed.json()
    assert (report["ok"], report["pushed"], report["in_sync"]) == (True, 2, 0)
    assert [(i["number"], i["outcome"], i["stripe_status"]) for i in report["invoices"]] == [
        ("INV-2026-000001", "pushed", "open"), ("INV-2026-000002", "pushed", "open")]
    assert_in_stripe_once(stripe_fake, stripe_env, conn, [feb.invoice_id, mar.invoice_id], ["open", "open"])
    created = [path for method, path, _ in stripe_fake.requests[first_request:] if method == "POST"
               and path == "/v1/invoices"]
    assert len(created) == 2
    numbers = [i["number"] for i in stripe_fake.list_objects(stripe_env, "invoice")]  # in creation order
    assert numbers == ["INV-2026-000001", "INV-2026-000002"]  # oldest first

    after = len(stripe_fake.requests)
    again = cli("stripe", "sync", "--json")
    assert again.code == 0 and (again.json()["pushed"], again.json()["in_sync"]) == (0, 2)
    assert [m for m, _, _ in stripe_fake.requests[after:] if m == "POST"] == []  # nothing sent again
    assert_in_stripe_once(stripe_fake, stripe_env, conn, [feb.invoice_id, mar.invoice_id], ["open", "open"])

    status = cli("stripe", "status", "--json").json()["invoices"]
    assert all(i["in_sync"] and i["finalized_in_stripe"] for i in status)
    assert {i["stripe_invoice"] for i in status} == {i["id"] for i in stripe_fake.list_objects(stripe_env, "invoice")}
    assert all(i["stripe_items"] == i["items_expected"] > 0 for i in status)
    text = cli("stripe", "status")
    assert text.code == 0 and "INV-2026-000002 acme 2026-03 open: in sync (finalized in Stripe" in text.out


def test_stripe_sync_pushes_customer_updates_once(conn, two_invoices, cli, stripe_env, stripe_fake):
    """`customers set` after the customer reached Stripe: the next `stripe sync` updates its name and
    e-mail there (one POST with a key from the customer and its version), a rerun sends nothing, and
    going back to the old values is pushed too."""
    assert cli("stripe", "sync").code == 0
    [customer] = stripe_fake.list_objects(stripe_env, "customer")
    assert (customer["name"], customer["email"]) == ("Acme", "billing@acme.test")

    assert cli("customers", "set", "acme", "--name", "Acme GmbH", "--email", "ap@acme.test").code == 0
    sent = len(stripe_fake.requests)
    result = cli("stripe", "sync", "--json")
    assert result.code == 0, result.out + result.err
    report = result.json()
    assert (report["customers_updated"], report["pushed"], report["in_sync"]) == (1, 0, 2)
    assert report["customers"] == [{"customer_id": "acme", "stripe_customer": customer["id"], "outcome": "updated",
                                    "error": None}]
    [customer] = stripe_fake.list_objects(stripe_env, "customer")
    assert (customer["name"], customer["email"]) == ("Acme GmbH", "ap@acme.test")
    posts = [(path, key) for method, path, key in stripe_fake.requests[sent:] if method == "POST"]
    assert [p for p, _ in posts] == [f"/v1/customers/{customer['id']}"]
    assert posts[0][1].startswith("infermeter:customerupdate:acme:")

    sent = len(stripe_fake.requests)
    again = cli("stripe", "sync", "--json")
    assert again.code == 0 and again.json()["customers_updated"] == 0
    assert [m for m, _, _ in stripe_fake.requests[sent:] if m == "POST"] == []

    assert cli("customers", "set", "acme", "--name", "Acme", "--email", "billing@acme.test").code == 0
    text = cli("stripe", "sync")
    assert text.code == 0 and "customer acme" in text.out and "updated" in text.out
    [customer] = stripe_fake.list_objects(stripe_env, "customer")
    assert (customer["name"], customer["email"]) == ("Acme", "billing@acme.test")
    assert stripe_fake.count(stripe_env, "customer") == 1


def test_stripe_sync_filters_by_period_and_customer(conn, two_invoices, cli, stripe_env, stripe_fake):
    only_march = cli("stripe", "sync", "--period", "2026-03", "--customer", "acme", "--json")
    assert only_march.code == 0, only_march.err
    assert [i["number"] for i in only_march.json()["invoices"]] == ["INV-2026-000002"]
    assert stripe_fake.count(stripe_env, "invoice") == 1
    unknown = cli("stripe", "sync", "--customer", "nobody")
    assert unknown.code == 2 and "unknown customer" in unknown.err


def test_stripe_sync_without_a_key_is_a_clear_error(conn, two_invoices, cli, monkeypatch):
    from infermeter.settings import get_settings

    monkeypatch.delenv("INFERMETER_STRIPE_API_KEY", raising=False)
    get_settings.cache_clear()
    result = cli("stripe", "sync")
    assert result.code == 2 and "INFERMETER_STRIPE_API_KEY is not set" in result.err
    assert stripe_objects(conn) == []


def test_a_crash_after_any_stripe_call_then_stripe_sync_creates_no_duplicate(
        conn, db_url, two_invoices, cli, stripe_fake, stripe_tools, monkeypatch):
    """For every k: the sync dies right after Stripe did call k (answer lost); `stripe sync` then finishes
    the job with exactly one customer, one item per line and one invoice per local invoice."""
    from sqlalchemy import create_engine

    from infermeter.settings import get_settings

    feb, mar = two_invoices
    engine = create_engine(db_url)
    try:
        probe_key = "sk_test_" + uuid.uuid4().hex
        client, http = stripe_tools.client_for(probe_key, stripe_fake.url)
        sync_invoices(conn, StripeSync(client, PostgresSyncState(engine)))
        calls = http.calls
        assert calls >= 2 * (3 + len(item_specs(show_invoice_obj(conn, feb.invoice_id))))
        for k in range(1, calls + 1):
            conn.execute("DELETE FROM stripe_objects")  # a fresh account (new API key), nothing recorded
            api_key = "sk_test_" + uuid.uuid4().hex
            client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
            with pytest.raises(stripe_tools.Crash):
                sync_invoices(conn, StripeSync(client, PostgresSyncState(engine)))
            monkeypatch.setenv("INFERMETER_STRIPE_API_KEY", api_key)
            monkeypatch.setenv("INFERMETER_STRIPE_API_BASE", stripe_fake.url)
            get_settings.cache_clear()
            rerun = cli("stripe", "sync", "--json")
            assert rerun.code == 0, (k, rerun.out, rerun.err)
            assert_in_stripe_once(stripe_fake, api_key, conn, [feb.invoice_id, mar.invoice_id], ["open", "open"])
            assert all(i["in_sync"] for i in cli("stripe", "status", "--json").json()["invoices"]), k
    finally:
        engine.dispose()


def show_invoice_obj(conn, invoice_id):
    from billing_service.store import PgInvoiceStore

    return PgInvoiceStore(conn).get(invoice_id).invoice


# ---------------------------------------------------------------- record_payment_status


def test_record_payment_status_goes_through_the_state_machine(conn, february):
    at = datetime(2026, 3, 9, tzinfo=UTC)
    paid = record_payment_status(conn, february.invoice_id, "paid", at, now=at)
    assert paid.changed and paid.invoice.status is InvoiceStatus.PAID
    history = show_invoice(conn, february.invoice_id)["history"]
    assert [(h["change"], h["status"]) for h in history][-1] == ("paid (reported 2026-03-09T00:00:00Z)", "paid")
    repeat = record_payment_status(conn, february.invoice_id, InvoiceStatus.PAID, at + timedelta(hours=1),
                                   now=at + timedelta(hours=1))
    assert not repeat.changed and len(show_invoice(conn, february.invoice_id)["history"]) == len(history)
    for impossible in ("payment_failed", "void"):
        with pytest.raises(InvoiceStateError, match="cannot go from paid"):
            record_payment_status(conn, february.invoice_id, impossible, at, now=at)
    with pytest.raises(InvoiceStateError, match="payment status is one of"):
        record_payment_status(conn, february.invoice_id, "open", at, now=at)
    assert len(show_invoice(conn, february.invoice_id)["history"]) == len(history)


def test_a_payment_failure_then_payment_and_a_report_dated_before_the_last_change(conn, february):
    finalized_at = datetime.fromisoformat(show_invoice(conn, february.invoice_id)["finalized_at"])
    early = finalized_at - timedelta(seconds=2)  # the collector's clock is a little behind ours
    failed = record_payment_status(conn, february.invoice_id, "payment_failed", early, now=finalized_at)
    assert failed.invoice.status is InvoiceStatus.PAYMENT_FAILED
    later = finalized_at + timedelta(days=2)
    assert record_payment_status(conn, february.invoice_id, "paid", later, now=later).invoice.status is InvoiceStatus.PAID
    assert [h["status"] for h in show_invoice(conn, february.invoice_id)["history"]] == [
        "draft", "open", "payment_failed", "paid"]


def test_void_reported_by_stripe_voids_and_reissues_like_invoices_void(conn, metering, february):
    at = datetime(2026, 3, 9, tzinfo=UTC)
    outcome = record_payment_status(conn, february.invoice_id, "void", at, now=at)
    assert outcome.invoice.status is InvoiceStatus.VOID and outcome.reissue is not None
    reissue = show_invoice(conn, outcome.reissue.id)
    assert (reissue["status"], reissue["reissue_of"], Decimal(reissue["total"])) == (
        "draft", february.invoice_id, february.total)
    assert not record_payment_status(conn, february.invoice_id, "void", at, now=at).changed
    [final] = billing_run(conn, "2026-02", now=at + timedelta(hours=1), cost_model=cost_model()).invoices
    assert (final.invoice_id, final.status, final.number) == (outcome.reissue.id, "open", "INV-2026-000002")


# ---------------------------------------------------------------- webhooks through the app


@pytest.fixture
def app_client(db_url, tmp_path):
    from fastapi.testclient import TestClient

    from app.api import create_app
    from infermeter.settings import Settings

    settings = Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=db_url, INFERMETER_STRIPE_WEBHOOK_SECRET=SECRET)
    app = create_app(settings, db_url, None)
    with TestClient(app) as client:
        yield client


def invoice_event(type_: str, stripe_invoice: dict, *, event_id: str, created: datetime) -> bytes:
    return json.dumps({
        "id": event_id, "object": "event", "type": type_, "created": int(created.timestamp()), "livemode": False,
        "data": {"object": stripe_invoice},
    }).encode()


def post_event(client, payload: bytes, at: datetime, secret: str = SECRET):
    return client.post("/v1/stripe/webhook", content=payload,
                       headers={"Stripe-Signature": sign(payload, secret, int(at.timestamp()))})


def test_signed_webhooks_posted_to_the_app_move_the_local_invoice(
        conn, two_invoices, cli, stripe_env, stripe_fake, app_client):
    feb, mar = two_invoices
    assert cli("stripe", "sync").code == 0
    theirs = {i["metadata"]["infermeter_invoice_id"]: i for i in stripe_fake.list_objects(stripe_env, "invoice")}
    now = datetime(2026, 4, 5, 12, tzinfo=UTC)
    app_client.app.state.clock = lambda: now

    paid = invoice_event("invoice.paid", {**theirs[feb.invoice_id], "status": "paid"}, event_id="evt_paid_1",
                         created=now - timedelta(seconds=20))
    answer = post_event(app_client, paid, now)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"received": True, "event_id": "evt_paid_1", "outcome": "applied",
                             "invoice_id": feb.invoice_id, "status": "paid"}
    shown = cli("invoices", "show", feb.invoice_id, "--json").json()
    assert shown["status"] == "paid"
    assert [(h["change"], h["status"], h["recorded_at"]) for h in shown["history"]][-1] == (
        "paid (reported 2026-04-05T11:59:40Z)", "paid", "2026-04-05T12:00:00Z")
    history = shown["history"]

    replay = post_event(app_client, paid, now + timedelta(seconds=5))  # Stripe redelivers the same event
    assert replay.status_code == 200 and replay.json()["outcome"] == "duplicate"
    second = invoice_event("invoice.paid", theirs[feb.invoice_id], event_id="evt_paid_2", created=now)
    assert post_event(app_client, second, now).json()["outcome"] == "applied"  # another event, same status
    assert cli("invoices", "show", feb.invoice_id, "--json").json()["history"] == history  # no second effect

    late_failure = invoice_event("invoice.payment_failed", theirs[feb.invoice_id], event_id="evt_failed_1",
                                 created=now - timedelta(minutes=1))
    ignored = post_event(app_client, late_failure, now)
    assert ignored.status_code == 200 and ignored.json()["outcome"] == "ignored"
    assert "cannot go from paid to payment_failed" in ignored.json()["reason"]

    forged = invoice_event("invoice.paid", theirs[mar.invoice_id], event_id="evt_forged", created=now)
    bad = post_event(app_client, forged, now, secret="whsec_not_ours")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_signature"
    assert show_invoice(conn, mar.invoice_id)["status"] == "open"
    assert conn.execute("SELECT count(*) FROM stripe_webhook_events WHERE event_id = 'evt_forged'").fetchone() == (0,)
    assert [r[0] for r in conn.execute("SELECT event_id FROM stripe_webhook_events ORDER BY event_id")] == [
        "evt_failed_1", "evt_paid_1", "evt_paid_2"]

    unknown = invoice_event("invoice.paid", {**theirs[mar.invoice_id], "metadata": {
        "infermeter_invoice_id": "inv_not_here"}}, event_id="evt_unknown", created=now)
    assert post_event(app_client, unknown, now).json()["outcome"] == "ignored"


def test_a_voided_webhook_voids_reissues_and_the_next_sync_pushes_the_reissue(
        conn, two_invoices, cli, stripe_env, stripe_fake, app_client):
    feb, mar = two_invoices
    assert cli("stripe", "sync").code == 0
    theirs = {i["metadata"]["infermeter_invoice_id"]: i for i in stripe_fake.list_objects(stripe_env, "invoice")}
    now = datetime(2026, 4, 6, tzinfo=UTC)
    app_client.app.state.clock = lambda: now
    voided = invoice_event("invoice.voided", {**theirs[mar.invoice_id], "status": "void"}, event_id="evt_void_1",
                           created=now)
    assert post_event(app_client, voided, now).json()["outcome"] == "applied"
    listed = cli("invoices", "list", "--period", "2026-03", "--json").json()["invoices"]
    assert [(i["number"], i["status"]) for i in listed] == [("INV-2026-000002", "void"), (None, "draft")]
    status = {i["number"]: i for i in cli("stripe", "status", "--json").json()["invoices"]}
    assert status["INV-2026-000002"]["in_sync"] is False  # void here, still open in the (fake) Stripe
    cli("billing", "run", "--period", "2026-03", now=now + timedelta(hours=1))
    pushed = cli("stripe", "sync", "--json")
    assert pushed.code == 0, pushed.out + pushed.err
    outcomes = {i["number"]: (i["outcome"], i["stripe_status"]) for i in pushed.json()["invoices"]}
    assert outcomes == {"INV-2026-000001": ("in_sync", None),
                        "INV-2026-000002": ("pushed", "void"), "INV-2026-000003": ("pushed", "open")}
    by_number = {i["number"]: i["status"] for i in stripe_fake.list_objects(stripe_env, "invoice")}
    assert by_number == {"INV-2026-000001": "open", "INV-2026-000002": "void", "INV-2026-000003": "open"}
    assert all(i["in_sync"] for i in cli("stripe", "status", "--json").json()["invoices"])


# ---------------------------------------------------------------- against localstripe


def test_stripe_sync_against_localstripe_fails_cleanly_where_it_lacks_invoices_and_never_duplicates(
        conn, two_invoices, cli, localstripe_url, monkeypatch):
    """localstripe serves customers and invoice items but cannot make a one-off invoice (docs/billing-stripe.md):
    the sync creates the customer and February's items, fails on the invoice (exit 1, March skipped so its
    items are not mixed in), and reruns — with the state kept, then lost — create nothing twice."""
    import stripe

    from infermeter.settings import get_settings

    feb, _ = two_invoices
    email = f"e2e-{uuid.uuid4().hex[:10]}@example.com"
    assert cli("customers", "set", "acme", "--email", email).code == 0
    monkeypatch.setenv("INFERMETER_STRIPE_API_KEY", "sk_test_localstripe")
    monkeypatch.setenv("INFERMETER_STRIPE_API_BASE", localstripe_url)
    get_settings.cache_clear()
    client = stripe.StripeClient("sk_test_localstripe", base_addresses={"api": localstripe_url})
    lines = len(show_invoice(conn, feb.invoice_id)["lines"])

    def in_localstripe() -> tuple[int, int]:
        customers = client.v1.customers.list(params={"email": email}).data
        items = [i for c in customers for i in client.v1.invoice_items.list(
            params={"customer": c.id, "limit": 100}).auto_paging_iter()]
        return len(customers), len(items)

    for attempt in ("first", "rerun", "state lost"):
        if attempt == "state lost":
            conn.execute("DELETE FROM stripe_objects")
        result = cli("stripe", "sync", "--json")
        assert result.code == 1, (attempt, result.out, result.err)
        outcomes = [(i["number"], i["outcome"]) for i in result.json()["invoices"]]
        assert outcomes == [("INV-2026-000001", "failed"), ("INV-2026-000002", "skipped")], attempt
        assert in_localstripe() == (1, lines), attempt
    status = {i["number"]: i for i in cli("stripe", "status", "--json").json()["invoices"]}
    assert status["INV-2026-000001"]["note"] == "push incomplete" and status["INV-2026-000001"]["stripe_items"] == lines
    assert status["INV-2026-000002"]["note"] == "not pushed yet"
