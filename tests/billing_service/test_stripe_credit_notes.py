"""Credit notes reach Stripe, on the real embedded PostgreSQL and the strict fake (localstripe has no credit
notes): `infermeter stripe sync` pushes each credit note of an invoice once its Stripe invoice is finalized,
in integer minor units of the invoice currency, once, whatever crashes in between; `stripe status` shows
them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing_service.credits import grant_credits, issue_credit_note
from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import show_invoice
from billing_service.run import billing_run
from billing_service.stripe.run import sync_invoices
from billing_service.stripe.state import PostgresSyncState
from billing_service.stripe.sync import StripeSync
from tests.billing_service.conftest import AFTER_GRACE, cost_model

pytest_plugins = ["tests.billing_service.conftest_stripe"]

JPY_BOOK_YAML = """\
id: bill-jpy
currency: JPY
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "300", per: 1000000}
  - meter: output_tokens
    price: {type: unit, amount: "1200", per: 1000000}
  - meter: "usage:tool_calls"
    price: {type: unit, amount: "7", per: 1}
"""
NOTE_AT = AFTER_GRACE + timedelta(days=1)


def yen_invoice(conn, metering, credits: str):
    """Customer tanaka (JPY) on bill-jpy with `credits` JPY of prepaid credits; February (2500 JPY of
    usage) finalized."""
    t0 = datetime(2026, 1, 20, tzinfo=UTC)
    set_customer(conn, "tanaka", now=t0, name="Tanaka KK", email="ap@tanaka.test", currency="JPY")
    assign_plan(conn, "tanaka", JPY_BOOK_YAML, "bill-jpy.yaml", "2026-02-01", now=t0)
    grant_credits(conn, "tanaka", credits, now=t0, reason="prepaid")
    metering.request("tanaka", datetime(2026, 2, 3, 10, tzinfo=UTC), input_tokens=2_000_000, output=1_000_000)
    metering.usage("tanaka", "tool_calls", "100", datetime(2026, 2, 11, tzinfo=UTC))
    [inv] = billing_run(conn, "2026-02", now=AFTER_GRACE, cost_model=cost_model()).invoices
    assert (inv.status, inv.currency, inv.subtotal) == ("open", "JPY", Decimal("2500"))  # 600 + 1200 + 700
    return inv


@pytest.fixture
def yen(conn, metering):
    inv = yen_invoice(conn, metering, "500")
    assert (inv.credits_applied, inv.total) == (Decimal("500"), Decimal("2000"))
    return inv


def line_of(conn, invoice_id: str, meter: str, model: str | None = None) -> dict:
    [line] = [x for x in show_invoice(conn, invoice_id)["lines"]
              if x["meter"] == meter and (model is None or x["model"] == model)]
    return line


def stripe_line_of(fake, api_key: str, invoice_id: str, line_id: str) -> str:
    [invoice] = [i for i in fake.list_objects(api_key, "invoice")
                 if i["metadata"]["infermeter_invoice_id"] == invoice_id]
    [item] = [i for i in fake.list_objects(api_key, "invoiceitem", invoice=invoice["id"])
              if i["metadata"]["infermeter_line_id"] == line_id]
    return "il_" + item["id"][3:]  # the fake's line id of an item


def notes_in_stripe(fake, api_key: str) -> dict[str, dict]:
    notes = fake.list_objects(api_key, "credit_note")
    by_ours = {n["metadata"]["infermeter_credit_note_id"]: n for n in notes}
    assert len(by_ours) == len(notes)  # one Stripe credit note per credit note
    return by_ours


def test_a_by_line_then_a_whole_invoice_credit_note_reach_stripe_in_cents(
        conn, february, cli, stripe_env, stripe_fake):
    """USD: a note on one line credits that Stripe line (pre-payment: the invoice is open); after the
    invoice is paid, the note for the rest credits each remaining line and is refunded. A rerun sends nothing."""
    inv = february.invoice_id
    assert cli("stripe", "sync").code == 0
    output = line_of(conn, inv, "output_tokens", "big")
    by_line = cli("invoices", "credit-note", inv, "--line", output["id"], "--reason", "wrong output price",
                  now=NOTE_AT)
    assert by_line.code == 0, by_line.err
    status = cli("stripe", "status", "--json").json()["credit_notes"]
    assert [(n["number"], n["in_sync"], n["note"], n["stripe_amount"]) for n in status] == [
        ("CN-2026-000001", False, "not pushed yet", output["amount"])]

    pushed = cli("stripe", "sync", "--json")
    assert pushed.code == 0, pushed.out + pushed.err
    report = pushed.json()
    assert report["credit_notes_pushed"] == 1 and report["pushed"] == 0
    [first] = notes_in_stripe(stripe_fake, stripe_env).values()
    cents = int(Decimal(output["amount"]) * 100)
    assert (first["amount"], first["currency"], first["type"]) == (cents, "usd", "pre_payment")
    assert [(x["type"], x["invoice_line_item"], x["amount"]) for x in first["lines"]["data"]] == [
        ("invoice_line_item", stripe_line_of(stripe_fake, stripe_env, inv, output["id"]), cents)]
    assert first["memo"].startswith("CN-2026-000001 (2026-03-03): wrong output price")
    assert first["metadata"]["infermeter_credit_note_number"] == "CN-2026-000001"

    [stripe_invoice] = stripe_fake.list_objects(stripe_env, "invoice")
    stripe_fake.pay(stripe_env, stripe_invoice["id"])
    assert cli("invoices", "credit-note", inv, "--reason", "goodwill", now=NOTE_AT).code == 0
    assert cli("stripe", "sync").code == 0
    notes = notes_in_stripe(stripe_fake, stripe_env)
    [second] = [n for n in notes.values() if n["id"] != first["id"]]
    rest = int(february.total * 100) - cents
    assert (second["amount"], second["type"], second["refunds"][0]["amount_refunded"]) == (rest, "post_payment", rest)
    others = [x for x in show_invoice(conn, inv)["lines"] if x["id"] != output["id"]]
    assert sorted((x["invoice_line_item"], x["amount"]) for x in second["lines"]["data"]) == sorted(
        (stripe_line_of(stripe_fake, stripe_env, inv, x["id"]), int(Decimal(x["amount"]) * 100)) for x in others)
    assert sum(n["amount"] for n in notes.values()) == int(february.total * 100)  # all of it given back

    sent = len(stripe_fake.requests)
    again = cli("stripe", "sync", "--json").json()
    assert again["credit_notes_pushed"] == 0 and [n["outcome"] for n in again["credit_notes"]] == ["in_sync"] * 2
    assert [m for m, _, _ in stripe_fake.requests[sent:] if m == "POST"] == []
    status = cli("stripe", "status", "--json").json()["credit_notes"]
    assert {(n["number"], n["in_sync"], n["stripe_credit_note"]) for n in status} == {
        ("CN-2026-000001", True, first["id"]), ("CN-2026-000002", True, second["id"])}
    text = cli("stripe", "status")
    assert "credit note CN-2026-000002 on INV-2026-000001 acme" in text.out and "credited in Stripe" in text.out


def test_jpy_credit_notes_in_yen_and_prepaid_credits_stay_ours(conn, yen, stripe_env, stripe_fake, stripe_tools,
                                                                cli):
    """JPY has no minor digits: amounts go as whole yen. A by-line note within what was charged credits
    the Stripe line; the note for the rest gives back only what Stripe charged (the rest of it returns the
    prepaid credits the invoice used), as one custom line saying so."""
    inv = yen.invoice_id
    assert cli("stripe", "sync").code == 0
    tools = line_of(conn, inv, "usage:tool_calls")  # 700 JPY
    issue_credit_note(conn, inv, reason="tool calls double-counted", now=NOTE_AT, line_ids=[tools["id"]])
    whole, _ = issue_credit_note(conn, inv, reason="service outage", now=NOTE_AT)
    assert (whole.total, whole.refund_amount, whole.credits_returned) == (Decimal("1800"), Decimal("1300"),
                                                                         Decimal("500"))
    report = cli("stripe", "sync", "--json").json()
    assert report["ok"] and report["credit_notes_pushed"] == 2
    notes = notes_in_stripe(stripe_fake, stripe_env)
    first = notes[report["credit_notes"][0]["id"]]
    assert (first["amount"], first["currency"]) == (700, "jpy")
    assert [(x["type"], x["invoice_line_item"], x["amount"]) for x in first["lines"]["data"]] == [
        ("invoice_line_item", stripe_line_of(stripe_fake, stripe_env, inv, tools["id"]), 700)]
    second = notes[whole.id]
    assert (second["amount"], second["type"]) == (1300, "pre_payment")
    [line] = second["lines"]["data"]
    assert (line["type"], line["unit_amount"], line["quantity"]) == ("custom_line_item", 1300, 1)
    assert "1800 JPY credited on INV-2026-000001, of which 500 JPY returned as prepaid credits" in line["description"]
    [stripe_invoice] = stripe_fake.list_objects(stripe_env, "invoice")
    client = stripe_tools.client_for(stripe_env, stripe_fake.url)[0]
    theirs = client.v1.invoices.retrieve(stripe_invoice["id"])
    assert (theirs.total, theirs.amount_due) == (2000, 0)  # 700 + 1300: all that Stripe charged is credited


def test_a_credit_note_that_only_returns_prepaid_credits_has_nothing_to_push(conn, metering, stripe_env,
                                                                             stripe_fake, cli):
    inv = yen_invoice(conn, metering, "3000")  # the credits pay it all: a zero total in Stripe
    assert (inv.credits_applied, inv.total) == (Decimal("2500"), Decimal("0"))
    assert cli("stripe", "sync").code == 0
    note, number = issue_credit_note(conn, inv.invoice_id, reason="outage", now=NOTE_AT)
    assert (note.refund_amount, note.credits_returned) == (Decimal("0"), Decimal("2500"))
    sent = len(stripe_fake.requests)
    report = cli("stripe", "sync", "--json").json()
    assert report["ok"] and [(n["outcome"], n["stripe_amount"]) for n in report["credit_notes"]] == [("in_sync", "0")]
    assert [m for m, _, _ in stripe_fake.requests[sent:] if m == "POST"] == []
    assert stripe_fake.count(stripe_env, "credit_note") == 0
    [status] = cli("stripe", "status", "--json").json()["credit_notes"]
    assert (status["number"], status["in_sync"], status["note"]) == (
        number, True, "nothing to credit in Stripe: it returns prepaid credits only")


def test_a_credit_note_waits_for_its_invoice(conn, february, stripe_fake, stripe_api_key, stripe_tools, cli,
                                             stripe_env, db_url):
    """Issued before its invoice reached Stripe: `stripe status` says it waits; when the invoice cannot be
    pushed, the note is not pushed either (`waiting`); once the invoice is pushed, the note follows it in
    the same run."""
    from sqlalchemy import create_engine

    inv = february.invoice_id
    issue_credit_note(conn, inv, reason="goodwill", now=NOTE_AT)
    [status] = cli("stripe", "status", "--json").json()["credit_notes"]
    assert (status["in_sync"], status["note"]) == (False, "waits for its invoice to be finalized in Stripe")

    engine = create_engine(db_url)
    try:
        client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
        sync = StripeSync(client, PostgresSyncState(engine))
        from billing_service.stripe.run import customer_info

        customer = sync.sync_customer(customer_info(conn, "acme", "USD"))
        stray = client.v1.invoice_items.create(params={"customer": customer, "amount": 5, "currency": "usd"})
        report = sync_invoices(conn, sync)
        assert [i.outcome for i in report.invoices] == ["failed"] and not report.ok
        assert [(n.outcome, n.note) for n in report.credit_notes] == [
            ("waiting", "waits for its invoice to be finalized in Stripe")]
        assert stripe_fake.count(stripe_env, "credit_note") == 0
        del stripe_fake.accounts[stripe_env].objects["invoiceitem"][stray.id]  # someone removes the stray item
    finally:
        engine.dispose()
    sent = len(stripe_fake.requests)
    rerun = cli("stripe", "sync", "--json")
    assert rerun.code == 0, rerun.out + rerun.err
    assert [n["outcome"] for n in rerun.json()["credit_notes"]] == ["pushed"]
    posts = [path for method, path, _ in stripe_fake.requests[sent:] if method == "POST"]
    assert posts[-1] == "/v1/credit_notes" and posts[-2].endswith("/finalize")
    [note] = notes_in_stripe(stripe_fake, stripe_env).values()
    assert note["amount"] == int(february.total * 100)


def test_a_crash_after_any_stripe_call_then_stripe_sync_pushes_each_credit_note_once(
        conn, db_url, february, cli, stripe_fake, stripe_tools, monkeypatch):
    """For every call k of a sync that pushes an invoice and two credit notes: it dies right after Stripe
    did call k; `stripe sync` then leaves exactly one Stripe credit note per credit note, with the right
    amount, the recorded state kept (even k) or lost (odd k: only the lookups by listing protect)."""
    from sqlalchemy import create_engine

    from infermeter.settings import get_settings

    inv = february.invoice_id
    output = line_of(conn, inv, "output_tokens", "big")
    by_line, _ = issue_credit_note(conn, inv, reason="wrong price", now=NOTE_AT, line_ids=[output["id"]])
    rest, _ = issue_credit_note(conn, inv, reason="goodwill", now=NOTE_AT)
    expected = {by_line.id: int(by_line.total * 100), rest.id: int(rest.total * 100)}
    engine = create_engine(db_url)
    try:
        probe_key = "sk_test_" + uuid.uuid4().hex
        client, http = stripe_tools.client_for(probe_key, stripe_fake.url)
        before = len(stripe_fake.requests)
        assert sync_invoices(conn, StripeSync(client, PostgresSyncState(engine))).ok
        calls = http.calls
        probe = [(m, p) for m, p, _ in stripe_fake.requests[before:]]
        assert len(probe) == calls and probe[-8:] == [  # per credit note: list, retrieve, lines, create
            ("GET", "/v1/credit_notes"), ("GET", probe[-7][1]), ("GET", probe[-6][1]), ("POST", "/v1/credit_notes")] * 2
        for k in range(1, calls + 1):
            conn.execute("DELETE FROM stripe_objects")
            api_key = "sk_test_" + uuid.uuid4().hex
            client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
            with pytest.raises(stripe_tools.Crash):
                sync_invoices(conn, StripeSync(client, PostgresSyncState(engine)))
            if k % 2:
                conn.execute("DELETE FROM stripe_objects WHERE kind = 'creditnote'")
            monkeypatch.setenv("INFERMETER_STRIPE_API_KEY", api_key)
            monkeypatch.setenv("INFERMETER_STRIPE_API_BASE", stripe_fake.url)
            get_settings.cache_clear()
            rerun = cli("stripe", "sync", "--json")
            assert rerun.code == 0, (k, rerun.out, rerun.err)
            notes = notes_in_stripe(stripe_fake, api_key)
            assert {cn: n["amount"] for cn, n in notes.items()} == expected, k
            assert stripe_fake.count(api_key, "invoice") == 1 and stripe_fake.count(api_key, "customer") == 1
            assert all(n["in_sync"] for n in cli("stripe", "status", "--json").json()["credit_notes"]), k
    finally:
        engine.dispose()


def test_a_credit_note_of_a_void_invoice_is_not_pushed(conn, february, cli, stripe_env, stripe_fake):
    """Voided in Stripe, the invoice owes nothing there: its credit note not pushed yet stays ours only."""
    inv = february.invoice_id
    assert cli("stripe", "sync").code == 0
    issue_credit_note(conn, inv, reason="goodwill", now=NOTE_AT)
    assert cli("invoices", "void", inv, now=NOTE_AT + timedelta(hours=1)).code == 0
    report = cli("stripe", "sync", "--json").json()
    assert report["ok"] and [(i["number"], i["outcome"], i["stripe_status"]) for i in report["invoices"]] == [
        ("INV-2026-000001", "pushed", "void")]
    assert [(n["outcome"], n["note"]) for n in report["credit_notes"]] == [
        ("in_sync", "invoice void: nothing to credit in Stripe")]
    assert stripe_fake.count(stripe_env, "credit_note") == 0
