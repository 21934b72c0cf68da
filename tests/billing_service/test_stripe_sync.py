"""The Stripe adapter: a crash after ANY call, then a rerun, creates nothing twice.

Customers and invoice items run against localstripe (real listing, and no idempotency: there only the
recorded state and the lookup by metadata protect); invoices, finalize and void against the strict fake
(localstripe cannot make an invoice without a subscription nor finalize one).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal

import pytest

from billing.invoice.drafts import draft_from_rating, with_credits_applied
from billing.invoice.states import finalize, void
from billing.periods import billing_period
from billing_service.stripe.state import InMemorySyncState, PostgresSyncState, SyncStateConflict
from billing_service.stripe.sync import CREDITS_LINE_ID, CustomerInfo, StripeSync, StripeSyncError, item_specs
from pricing.book import price_book_from_data
from pricing.rating import rate
from pricing.usage import Usage, UsageKey
from tests.billing.helpers import PERIOD, ROWS, T_FINAL, rating

pytest_plugins = ["tests.billing_service.conftest_stripe"]


def finalized(rated=None, *, credits: str | None = None, number: str = "INV-2026-000001"):
    draft = draft_from_rating(rated or rating(ROWS), PERIOD, price_book_version="v1")
    if credits is not None:
        draft = with_credits_applied(draft, Decimal(credits))
    return finalize(draft, number=number, at=T_FINAL)


def rated_in(currency: str, amount: str, customer: str = "c1"):
    book = price_book_from_data({"id": f"b-{currency}", "currency": currency, "charges": [
        {"meter": "output_tokens", "price": {"type": "unit", "amount": amount, "per": 1000000}},
        {"meter": "uncached_input_tokens", "price": {"type": "unit", "amount": amount, "per": 3000000}},
    ]})
    usage = Usage.build(customer, PERIOD.start, PERIOD.end, [
        (UsageKey("output_tokens", "m"), Decimal(1_234_567)), (UsageKey("uncached_input_tokens", "m"), Decimal(7_654_321)),
    ])
    return rate(book, usage)


def customer_info(invoice, email: str | None = None) -> CustomerInfo:
    return CustomerInfo(invoice.customer_id, "Customer One", email or f"{uuid.uuid4().hex[:8]}@example.com",
                        invoice.currency)


def assert_pushed_once(fake, api_key: str, invoice, status: str) -> None:
    customers = fake.list_objects(api_key, "customer")
    assert len(customers) == 1
    items = fake.list_objects(api_key, "invoiceitem")
    specs = item_specs(invoice)
    assert len(items) == len(specs)
    assert sorted(i["metadata"]["infermeter_line_id"] for i in items) == sorted(s.line_id for s in specs)
    invoices = fake.list_objects(api_key, "invoice")
    assert len(invoices) == 1
    (stripe_invoice,) = invoices
    assert all(i["invoice"] == stripe_invoice["id"] for i in items)
    assert stripe_invoice["status"] == status and stripe_invoice["number"] == invoice.number
    assert stripe_invoice["metadata"]["infermeter_invoice_id"] == invoice.id
    minor = int(invoice.total.scaleb(invoice.money.minor_units))
    assert sum(i["amount"] for i in items) == minor


# ---------------------------------------------------------------- against the strict fake


def test_push_open_then_void(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized()
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    sync = StripeSync(client, InMemorySyncState())
    customer = customer_info(invoice)
    result = sync.sync_invoice(invoice, customer)
    assert result.status == "open" and len(result.items) == len(invoice.lines)
    assert_pushed_once(stripe_fake, stripe_api_key, invoice, "open")
    again = sync.sync_invoice(invoice, customer)
    assert (again.invoice, again.status) == (result.invoice, "open")
    result = sync.sync_invoice(void(invoice, at=T_FINAL), customer)
    assert result.status == "void"
    assert_pushed_once(stripe_fake, stripe_api_key, invoice, "void")


def test_every_post_carries_a_key_from_the_invoice_and_line_ids(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized()
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    before = len(stripe_fake.requests)
    StripeSync(client, InMemorySyncState()).sync_invoice(void(invoice, at=T_FINAL), customer_info(invoice))
    posts = [(path, key) for method, path, key in stripe_fake.requests[before:] if method == "POST"]
    keys = [key for _, key in posts]
    assert None not in keys and len(set(keys)) == len(keys)
    assert f"infermeter:customer:{invoice.customer_id}" in keys
    assert f"infermeter:invoice:{invoice.id}" in keys
    assert f"infermeter:finalize:{invoice.id}:{invoice.number}" in keys
    assert f"infermeter:void:{invoice.id}" in keys
    for line in invoice.lines:
        minor = int(line.amount.scaleb(2))
        assert f"infermeter:invoiceitem:{invoice.id}:{line.id}:{minor}" in keys


def _calls_of_a_clean_run(fake, stripe_tools, invoice) -> int:
    client, http = stripe_tools.client_for("sk_test_" + uuid.uuid4().hex, fake.url)
    StripeSync(client, InMemorySyncState()).sync_invoice(invoice, customer_info(invoice))
    return http.calls


@pytest.mark.parametrize("local_status", ["open", "void"])
@pytest.mark.parametrize("lose_state", [False, True], ids=["state-kept", "state-lost"])
def test_a_crash_after_any_call_then_a_rerun_creates_nothing_twice(stripe_fake, stripe_tools, local_status,
                                                                    lose_state):
    """Crash after call k for every k of a full push; rerun. With the state kept, the rerun skips what was
    recorded and the idempotency key heals the one call whose answer was lost; with the state lost too,
    the lookups by metadata and the keys find everything."""
    invoice = finalized(credits="10.00")
    if local_status == "void":
        invoice = void(invoice, at=T_FINAL)
    calls = _calls_of_a_clean_run(stripe_fake, stripe_tools, invoice)
    assert calls >= 12
    for k in range(1, calls + 1):
        api_key = "sk_test_" + uuid.uuid4().hex
        state = InMemorySyncState()
        customer = customer_info(invoice)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
        with pytest.raises(stripe_tools.Crash):
            StripeSync(client, state).sync_invoice(invoice, customer)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url)
        result = StripeSync(client, InMemorySyncState() if lose_state else state).sync_invoice(invoice, customer)
        assert result.status == local_status, k
        assert_pushed_once(stripe_fake, api_key, invoice, local_status)


def test_a_crash_then_a_rerun_after_the_keys_expired_is_saved_by_the_lookups(stripe_fake, stripe_tools):
    """Stripe forgets idempotency keys after 24 hours: then only the recorded state and the lookups by
    metadata stop a duplicate."""
    invoice = finalized()
    calls = _calls_of_a_clean_run(stripe_fake, stripe_tools, invoice)
    for k in range(1, calls + 1):
        api_key = "sk_test_" + uuid.uuid4().hex
        state = InMemorySyncState()
        customer = customer_info(invoice)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
        with pytest.raises(stripe_tools.Crash):
            StripeSync(client, state).sync_invoice(invoice, customer)
        stripe_fake.clock.advance(24 * 3600 + 1)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url)
        StripeSync(client, state).sync_invoice(invoice, customer)
        assert_pushed_once(stripe_fake, api_key, invoice, "open")


def test_two_crashes_in_a_row(stripe_fake, stripe_tools):
    invoice = finalized()
    calls = _calls_of_a_clean_run(stripe_fake, stripe_tools, invoice)
    for k1 in range(1, calls + 1, 2):
        for k2 in (1, 2, 3, 5, 8):
            api_key = "sk_test_" + uuid.uuid4().hex
            state = InMemorySyncState()
            customer = customer_info(invoice)
            for k in (k1, k2):
                client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
                try:
                    StripeSync(client, state).sync_invoice(invoice, customer)
                except stripe_tools.Crash:
                    pass
            client, _ = stripe_tools.client_for(api_key, stripe_fake.url)
            StripeSync(client, state).sync_invoice(invoice, customer)
            assert_pushed_once(stripe_fake, api_key, invoice, "open")


@pytest.mark.parametrize(("currency", "price", "places"), [("JPY", "150", 0), ("BHD", "0.755", 3), ("USD", "0.80", 2)])
def test_amounts_go_in_integer_minor_units(stripe_fake, stripe_api_key, stripe_tools, currency, price, places):
    invoice = finalized(rated_in(currency, price))
    assert invoice.currency == currency and invoice.money.minor_units == places
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    StripeSync(client, InMemorySyncState()).sync_invoice(invoice, customer_info(invoice))
    items = {i["metadata"]["infermeter_line_id"]: i for i in stripe_fake.list_objects(stripe_api_key, "invoiceitem")}
    for line in invoice.lines:
        assert items[line.id]["amount"] == int(line.amount.scaleb(places))
        assert items[line.id]["currency"] == currency.lower()
        assert items[line.id]["metadata"]["infermeter_period"] == line.period
    (stripe_invoice,) = stripe_fake.list_objects(stripe_api_key, "invoice")
    assert stripe_invoice["currency"] == currency.lower()


def test_prepaid_credits_are_a_negative_item_so_the_totals_agree(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized(credits="42.83")
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    result = StripeSync(client, InMemorySyncState()).sync_invoice(invoice, customer_info(invoice))
    assert CREDITS_LINE_ID in result.items
    (credit,) = stripe_fake.list_objects(stripe_api_key, "invoiceitem", amount=-4283)
    assert credit["metadata"]["infermeter_line_id"] == CREDITS_LINE_ID
    assert_pushed_once(stripe_fake, stripe_api_key, invoice, "open")
    assert client.v1.invoices.retrieve(result.invoice).total == 10000


def test_a_foreign_pending_item_stops_the_push_before_the_invoice(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized()
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    sync = StripeSync(client, InMemorySyncState())
    customer = customer_info(invoice)
    stripe_customer = sync.sync_customer(customer)
    client.v1.invoice_items.create(params={"customer": stripe_customer, "amount": 999, "currency": "usd"})
    with pytest.raises(StripeSyncError, match="sweep them in"):
        sync.sync_invoice(invoice, customer)
    assert stripe_fake.count(stripe_api_key, "invoice") == 0


def test_drafts_are_not_pushed(stripe_fake, stripe_api_key, stripe_tools):
    draft = draft_from_rating(rating(ROWS), PERIOD, price_book_version="v1")
    client, http = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    with pytest.raises(ValueError, match="draft"):
        StripeSync(client, InMemorySyncState()).sync_invoice(draft, customer_info(draft))
    assert http.calls == 0


def test_an_invoice_of_the_next_period_for_the_same_customer(stripe_fake, stripe_api_key, stripe_tools):
    first = finalized()
    march = billing_period("2026-03", "Europe/Berlin", 7)
    second = finalize(draft_from_rating(rating(ROWS, period=march), march, price_book_version="v1"),
                      number="INV-2026-000002", at=march.end)
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    sync = StripeSync(client, InMemorySyncState())
    customer = customer_info(first)
    a = sync.sync_invoice(first, customer)
    b = sync.sync_invoice(second, customer)
    assert a.customer == b.customer and a.invoice != b.invoice
    assert stripe_fake.count(stripe_api_key, "customer") == 1 and stripe_fake.count(stripe_api_key, "invoice") == 2


# ---------------------------------------------------------------- PostgreSQL state


def test_postgres_state_survives_a_crash_after_any_call(stripe_fake, stripe_tools, stripe_pg_engine):
    invoice = void(finalized(), at=T_FINAL)
    calls = _calls_of_a_clean_run(stripe_fake, stripe_tools, invoice)
    for k in range(1, calls + 1):
        api_key = "sk_test_" + uuid.uuid4().hex
        customer = CustomerInfo(f"c-{k}", "Customer", f"c{k}-{uuid.uuid4().hex[:6]}@example.com", "USD")
        inv = void(finalize(draft_from_rating(rating(ROWS, customer=customer.id), PERIOD, price_book_version="v1"),
                            number="INV-2026-000001", at=T_FINAL), at=T_FINAL)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url, crash_after=k)
        with pytest.raises(stripe_tools.Crash):
            StripeSync(client, PostgresSyncState(stripe_pg_engine)).sync_invoice(inv, customer)
        client, _ = stripe_tools.client_for(api_key, stripe_fake.url)
        assert StripeSync(client, PostgresSyncState(stripe_pg_engine)).sync_invoice(inv, customer).status == "void"
        assert_pushed_once(stripe_fake, api_key, inv, "void")
    state = PostgresSyncState(stripe_pg_engine)
    record = state.get("invoice", inv.id)
    assert record is not None and record.idempotency_key == f"infermeter:invoice:{inv.id}"


def test_postgres_state_refuses_a_second_stripe_object_for_one_local_object(stripe_pg_engine):
    state = PostgresSyncState(stripe_pg_engine)
    state.record("customer", "c1", "cus_1", "infermeter:customer:c1")
    state.record("customer", "c1", "cus_1", "infermeter:customer:c1")  # the same again: fine
    with pytest.raises(SyncStateConflict):
        state.record("customer", "c1", "cus_2", "infermeter:customer:c1")
    memory = InMemorySyncState()
    memory.record("customer", "c1", "cus_1", "k")
    with pytest.raises(SyncStateConflict):
        memory.record("customer", "c1", "cus_2", "k")
    assert state.get("customer", "c1").stripe_id == "cus_1" and state.get("invoice", "c1") is None


# ---------------------------------------------------------------- against localstripe


def test_localstripe_customers_and_items_after_a_crash_after_any_call(localstripe_url, stripe_tools):
    """localstripe ignores idempotency keys: here the recorded state and the lookups (customers by email,
    the customer's invoice items by metadata) alone prevent duplicates."""
    invoice = finalized()
    api_key = "sk_test_localstripe"

    def push(sync, customer):
        return sync.sync_items(invoice, sync.sync_customer(customer))

    client, http = stripe_tools.client_for(api_key, localstripe_url)
    push(StripeSync(client, InMemorySyncState()), customer_info(invoice))
    calls = http.calls
    assert calls == 1 + 1 + 1 + len(invoice.lines)  # list customers, create, list items, create each item
    for k in range(1, calls + 1):
        customer = customer_info(invoice, email=f"k{k}-{uuid.uuid4().hex[:8]}@example.com")
        state = InMemorySyncState()
        client, _ = stripe_tools.client_for(api_key, localstripe_url, crash_after=k)
        with pytest.raises(stripe_tools.Crash):
            push(StripeSync(client, state), customer)
        client, _ = stripe_tools.client_for(api_key, localstripe_url)
        items = push(StripeSync(client, state), customer)
        customers = client.v1.customers.list(params={"email": customer.email}).data
        assert len(customers) == 1, k
        assert customers[0].metadata["infermeter_customer_id"] == invoice.customer_id
        listed = list(client.v1.invoice_items.list(params={"customer": customers[0].id, "limit": 100})
                      .auto_paging_iter())
        assert len(listed) == len(invoice.lines), k
        assert {i.id for i in listed} == set(items.values())
        assert {i.metadata["infermeter_line_id"] for i in listed} == {line.id for line in invoice.lines}
        assert {i.metadata["infermeter_invoice_id"] for i in listed} == {invoice.id}
        # a rerun with the state lost finds everything by listing
        again = push(StripeSync(client, InMemorySyncState()), customer)
        assert again == items


def test_localstripe_lists_pages_of_items(localstripe_url, stripe_tools):
    """More items than one page (the adapter lists 100 at a time): the lookup pages through them all."""
    invoice = finalized()
    client, _ = stripe_tools.client_for("sk_test_localstripe", localstripe_url)
    sync = StripeSync(client, InMemorySyncState())
    customer = customer_info(invoice)
    stripe_customer = sync.sync_customer(customer)
    for n in range(3):
        client.v1.invoice_items.create(params={"customer": stripe_customer, "amount": n + 1, "currency": "usd"})
    StripeSync(client, sync.state, page_size=2).sync_items(invoice, stripe_customer)
    items = StripeSync(client, InMemorySyncState(), page_size=2).sync_items(invoice, stripe_customer)
    listed = list(client.v1.invoice_items.list(params={"customer": stripe_customer, "limit": 2}).auto_paging_iter())
    assert len(listed) == 3 + len(invoice.lines)
    assert set(items.values()) <= {i.id for i in listed}


# ---------------------------------------------------------------- customer updates


def test_a_customer_update_is_pushed_once_per_version_with_its_key(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized()
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    sync = StripeSync(client, InMemorySyncState())
    first = CustomerInfo(invoice.customer_id, "Customer One", "one@example.com", invoice.currency, "v1")
    stripe_customer = sync.sync_customer(first)
    assert sync.update_customer(first, 0) is False  # created with these values: push 0 is recorded

    renamed = replace(first, name="Customer One GmbH", email=None, version="v2")
    assert sync.update_customer(renamed, 1) is True
    assert sync.update_customer(renamed, 1) is False  # this push is recorded
    [customer] = stripe_fake.list_objects(stripe_api_key, "customer")
    assert (customer["id"], customer["name"], customer["email"]) == (stripe_customer, "Customer One GmbH", None)
    updates = [key for method, path, key in stripe_fake.requests
               if method == "POST" and path == f"/v1/customers/{stripe_customer}"]
    assert updates == [f"infermeter:customerupdate:{invoice.customer_id}:1:v2"]

    assert sync.update_customer(first, 2) is True  # back to the first values: a new push, a new key
    [customer] = stripe_fake.list_objects(stripe_api_key, "customer")
    assert (customer["name"], customer["email"]) == ("Customer One", "one@example.com")


def test_a_customer_update_whose_answer_is_lost_is_done_once_by_the_rerun(stripe_fake, stripe_api_key, stripe_tools):
    invoice = finalized()
    state = InMemorySyncState()
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    info = CustomerInfo(invoice.customer_id, "Customer One", "one@example.com", invoice.currency, "v1")
    stripe_customer = StripeSync(client, state).sync_customer(info)
    changed = replace(info, email="two@example.com", version="v2")
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url, crash_after=1)
    with pytest.raises(stripe_tools.Crash):  # Stripe updated the customer, the answer never came back
        StripeSync(client, state).update_customer(changed, 1)
    assert state.get("customer_update", f"{invoice.customer_id}@1") is None
    client, _ = stripe_tools.client_for(stripe_api_key, stripe_fake.url)
    assert StripeSync(client, state).update_customer(changed, 1) is True
    sent = [key for method, path, key in stripe_fake.requests
            if method == "POST" and path == f"/v1/customers/{stripe_customer}"]
    assert sent == [f"infermeter:customerupdate:{invoice.customer_id}:1:v2"] * 2  # the same key: done once
    [customer] = stripe_fake.list_objects(stripe_api_key, "customer")
    assert customer["email"] == "two@example.com"


def test_localstripe_customer_update(localstripe_url, stripe_tools):
    """Against localstripe: the update lands, and the customer is found under its new e-mail (what a rerun
    with the state lost looks it up by)."""
    invoice = finalized()
    client, _ = stripe_tools.client_for("sk_test_localstripe", localstripe_url)
    sync = StripeSync(client, InMemorySyncState())
    info = replace(customer_info(invoice), version="v1")
    stripe_customer = sync.sync_customer(info)
    email = f"renamed-{uuid.uuid4().hex[:8]}@example.com"
    assert sync.update_customer(replace(info, name="Renamed Ltd", email=email, version="v2"), 1) is True
    got = client.v1.customers.retrieve(stripe_customer)
    assert (got.name, got.email) == ("Renamed Ltd", email)
    assert [c.id for c in client.v1.customers.list(params={"email": email}).data] == [stripe_customer]
    assert StripeSync(client, InMemorySyncState()).sync_customer(replace(info, email=email)) == stripe_customer
