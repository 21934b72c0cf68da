"""The strict Stripe fake: it refuses what Stripe would refuse and follows Stripe's idempotency rules."""

from __future__ import annotations

import httpx
import pytest
import stripe

pytest_plugins = ["tests.billing_service.conftest_stripe"]


@pytest.fixture
def client(stripe_fake, stripe_api_key, stripe_tools) -> stripe.StripeClient:
    return stripe_tools.client_for(stripe_api_key, stripe_fake.url)[0]


def _customer(client, key=None, **params):
    return client.v1.customers.create(params={"name": "Acme", **params},
                                      options={"idempotency_key": key} if key else None)


def test_unknown_parameter_is_a_stripe_shaped_400(stripe_fake, stripe_api_key):
    response = httpx.post(f"{stripe_fake.url}/v1/customers", data={"name": "Acme", "colour": "blue"},
                          headers={"Authorization": f"Bearer {stripe_api_key}"})
    assert response.status_code == 400
    assert response.json() == {"error": {"type": "invalid_request_error", "param": "colour",
                                         "message": "Received unknown parameter: colour",
                                         "code": "parameter_unknown"}}
    assert stripe_fake.count(stripe_api_key, "customer") == 0


def test_unknown_and_unimplemented_parameters_raise_invalid_request_error(client, stripe_fake, stripe_api_key):
    customer = _customer(client)
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": 100, "currency": "usd",
                                               "unit_price": 3})
    assert exc.value.param == "unit_price" and exc.value.http_status == 400
    with pytest.raises(stripe.InvalidRequestError, match="not implemented by this fake") as exc:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": 100, "currency": "usd",
                                               "period": {"start": 1, "end": 2}})
    assert exc.value.param == "period"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoices.finalize_invoice("in_x", params={"auto_advance": True, "send": True})
    assert exc.value.param == "send"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoices.list(params={"customer": customer.id, "sort": "asc"})
    assert exc.value.param == "sort"
    assert stripe_fake.count(stripe_api_key, "invoiceitem") == 0


def test_required_parameters_and_types(client, stripe_fake, stripe_api_key):
    customer = _customer(client)
    with pytest.raises(stripe.InvalidRequestError, match="Missing required param: currency") as exc:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": 100})
    assert exc.value.param == "currency"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoices.create(params={"auto_advance": False})
    assert exc.value.param == "customer"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": "1.50", "currency": "usd"})
    assert exc.value.param == "amount"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": 150, "currency": "USD"})
    assert exc.value.param == "currency"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoices.create(params={"customer": customer.id, "pending_invoice_items_behavior": "all"})
    assert exc.value.param == "pending_invoice_items_behavior"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.create(params={"metadata": {"k" * 41: "v"}})
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.invoice_items.create(params={"customer": "cus_missing", "amount": 1, "currency": "usd"})
    assert exc.value.http_status == 404 and exc.value.code == "resource_missing"
    assert stripe_fake.count(stripe_api_key, "invoiceitem") == 0


def test_same_key_same_body_replays_the_first_response(client, stripe_fake, stripe_api_key):
    first = _customer(client, "k1", email="a@example.com")
    again = _customer(client, "k1", email="a@example.com")
    assert again.id == first.id
    assert stripe_fake.count(stripe_api_key, "customer") == 1
    raw = httpx.post(f"{stripe_fake.url}/v1/customers", data={"name": "Acme", "email": "a@example.com"},
                     headers={"Authorization": f"Bearer {stripe_api_key}", "Idempotency-Key": "k1"})
    assert raw.json()["id"] == first.id and raw.headers["idempotent-replayed"] == "true"


def test_same_key_other_body_is_an_idempotency_error(client, stripe_fake, stripe_api_key):
    first = _customer(client, "k2", email="a@example.com")
    with pytest.raises(stripe.IdempotencyError, match="same parameters") as exc:
        _customer(client, "k2", email="b@example.com")
    assert exc.value.http_status == 400
    assert exc.value.error.type == "idempotency_error"
    # another endpoint with the same key is another request too
    with pytest.raises(stripe.IdempotencyError):
        client.v1.invoice_items.create(params={"customer": first.id, "amount": 1, "currency": "usd"},
                                       options={"idempotency_key": "k2"})
    assert stripe_fake.count(stripe_api_key, "customer") == 1
    assert stripe_fake.count(stripe_api_key, "invoiceitem") == 0


def test_errors_after_validation_are_replayed_and_validation_errors_are_not_saved(client, stripe_fake,
                                                                                   stripe_api_key):
    customer = _customer(client)
    item = {"customer": customer.id, "amount": 5, "currency": "usd"}
    with pytest.raises(stripe.InvalidRequestError):  # refused while validating: nothing saved for the key
        client.v1.invoice_items.create(params={**item, "colour": "x"}, options={"idempotency_key": "k3"})
    created = client.v1.invoice_items.create(params=item, options={"idempotency_key": "k3"})
    assert created.amount == 5
    invoice = client.v1.invoices.create(params={"customer": customer.id, "currency": "usd"})
    with pytest.raises(stripe.InvalidRequestError, match="only a finalized"):
        client.v1.invoices.void_invoice(invoice.id, options={"idempotency_key": "k4"})
    client.v1.invoices.finalize_invoice(invoice.id)
    # the void failed once the endpoint ran: the key answers that failure again, even though it could work now
    with pytest.raises(stripe.InvalidRequestError, match="only a finalized"):
        client.v1.invoices.void_invoice(invoice.id, options={"idempotency_key": "k4"})
    assert client.v1.invoices.void_invoice(invoice.id, options={"idempotency_key": "k5"}).status == "void"


def test_keys_are_scoped_per_api_key(stripe_fake, stripe_api_key, stripe_tools):
    client_for = stripe_tools.client_for
    one = client_for(stripe_api_key, stripe_fake.url)[0]
    other_key = stripe_api_key + "x"
    other = client_for(other_key, stripe_fake.url)[0]
    a = _customer(one, "shared-key")
    b = _customer(other, "shared-key", email="different@example.com")  # no idempotency_error: other account
    assert a.id != b.id
    assert stripe_fake.count(stripe_api_key, "customer") == 1 and stripe_fake.count(other_key, "customer") == 1
    with pytest.raises(stripe.InvalidRequestError):  # and objects are per account
        other.v1.customers.retrieve(a.id)


def test_keys_expire_after_24_hours(client, stripe_fake, stripe_api_key):
    first = _customer(client, "k6")
    stripe_fake.clock.advance(24 * 3600 + 1)
    second = _customer(client, "k6")
    assert second.id != first.id and stripe_fake.count(stripe_api_key, "customer") == 2


def test_invoice_lifecycle_and_pending_items(client, stripe_fake, stripe_api_key):
    customer = _customer(client)
    mine = client.v1.invoice_items.create(params={"customer": customer.id, "amount": 1234, "currency": "jpy",
                                                  "metadata": {"line": "a"}})
    client.v1.invoice_items.create(params={"customer": customer.id, "amount": -234, "currency": "jpy"})
    invoice = client.v1.invoices.create(params={"customer": customer.id, "currency": "jpy", "auto_advance": False,
                                                "pending_invoice_items_behavior": "include", "number": "INV-1"})
    assert (invoice.status, invoice.total, invoice.number, len(invoice.lines.data)) == ("draft", 1000, "INV-1", 2)
    assert invoice.lines.data[0].metadata["line"] == "a"
    assert client.v1.invoice_items.retrieve(mine.id).invoice == invoice.id
    assert client.v1.invoice_items.list(params={"customer": customer.id, "pending": True}).data == []
    empty = client.v1.invoices.create(params={"customer": customer.id, "currency": "jpy"})
    assert empty.total == 0 and empty.lines.data == []  # exclude is the default
    with pytest.raises(stripe.InvalidRequestError, match="only a finalized"):
        client.v1.invoices.void_invoice(invoice.id)
    opened = client.v1.invoices.finalize_invoice(invoice.id, params={"auto_advance": True})
    assert (opened.status, opened.auto_advance, opened.amount_due) == ("open", True, 1000)
    with pytest.raises(stripe.InvalidRequestError, match="already finalized"):
        client.v1.invoices.finalize_invoice(invoice.id)
    voided = client.v1.invoices.void_invoice(invoice.id)
    assert (voided.status, voided.amount_due) == ("void", 0)
    listed = client.v1.invoices.list(params={"customer": customer.id, "limit": 1})
    assert listed.has_more and len(listed.data) == 1
    assert {i.id for i in listed.auto_paging_iter()} == {invoice.id, empty.id}


def test_auth_and_unknown_urls(stripe_fake):
    assert httpx.get(f"{stripe_fake.url}/v1/customers").status_code == 401
    response = httpx.post(f"{stripe_fake.url}/v1/prices", data={"currency": "usd"},
                          headers={"Authorization": "Bearer sk_test_x"})
    assert response.status_code == 404 and response.json()["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- credit notes


def _open_invoice(client, currency="usd", amounts=(1000, 250)):
    customer = _customer(client)
    for amount in amounts:
        client.v1.invoice_items.create(params={"customer": customer.id, "amount": amount, "currency": currency})
    invoice = client.v1.invoices.create(params={"customer": customer.id, "currency": currency,
                                                "pending_invoice_items_behavior": "include"})
    return client.v1.invoices.finalize_invoice(invoice.id)


def test_credit_note_parameters_are_stripes_and_nothing_else(client, stripe_fake, stripe_api_key):
    invoice = _open_invoice(client)
    line = invoice.lines.data[0].id
    ok_line = {"type": "invoice_line_item", "invoice_line_item": line, "amount": 100}
    refused = [
        ({"invoice": invoice.id, "lines": [ok_line], "colour": "x"}, "colour", "unknown parameter"),
        ({"invoice": invoice.id, "lines": [{**ok_line, "colour": "x"}]}, "lines[0][colour]", "unknown parameter"),
        ({"invoice": invoice.id, "shipping_cost": {"shipping_rate": "shr_1"}}, "shipping_cost", "not implemented"),
        ({"invoice": invoice.id, "lines": [{**ok_line, "tax_rates": ["txr_1"]}]}, "lines[0][tax_rates]",
         "not implemented"),
        ({"invoice": invoice.id}, "lines", "One of amount, lines"),
        ({"lines": [ok_line]}, "invoice", "Missing required param"),
        ({"invoice": invoice.id, "lines": [{"invoice_line_item": line, "amount": 1}]}, "lines[0][type]",
         "Missing required param"),
        ({"invoice": invoice.id, "lines": [{**ok_line, "description": "x"}]}, "lines[0][description]",
         "only valid when type is custom_line_item"),
        ({"invoice": invoice.id, "lines": [{"type": "custom_line_item", "unit_amount": 5}]},
         "lines[0][description]", "Missing required param"),
        ({"invoice": invoice.id, "lines": [{"type": "custom_line_item", "description": "x", "unit_amount": 5,
                                            "invoice_line_item": line}]},
         "lines[0][invoice_line_item]", "only valid when type is invoice_line_item"),
        ({"invoice": invoice.id, "lines": [{**ok_line, "amount": -1}]}, "lines[0][amount]", "greater than or equal"),
        ({"invoice": invoice.id, "lines": [ok_line], "reason": "changed_my_mind"}, "reason", "must be one of"),
    ]
    for params, param, message in refused:
        with pytest.raises(stripe.InvalidRequestError, match=message.replace("[", r"\[")) as exc:
            client.v1.credit_notes.create(params=params)
        assert exc.value.param == param, params
    assert stripe_fake.count(stripe_api_key, "credit_note") == 0


def test_credit_notes_follow_stripes_amount_rules(client, stripe_fake, stripe_api_key):
    invoice = _open_invoice(client)  # 1000 + 250, open
    first, second = (line.id for line in invoice.lines.data)
    with pytest.raises(stripe.InvalidRequestError, match="exceeds what is left to credit on it"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "lines": [
            {"type": "invoice_line_item", "invoice_line_item": second, "amount": 251}]})
    with pytest.raises(stripe.InvalidRequestError, match="No such invoice line item"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "lines": [
            {"type": "invoice_line_item", "invoice_line_item": "il_other", "amount": 1}]})
    with pytest.raises(stripe.InvalidRequestError, match="must equal the sum of the lines"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 5, "lines": [
            {"type": "invoice_line_item", "invoice_line_item": second, "amount": 4}]})
    # open: the credit lowers what is due, nothing to refund (a refund_amount is refused)
    with pytest.raises(stripe.InvalidRequestError, match="post-payment amount"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "refund_amount": 200, "lines": [
            {"type": "invoice_line_item", "invoice_line_item": second, "amount": 200}]})
    pre = client.v1.credit_notes.create(params={"invoice": invoice.id, "memo": "m", "metadata": {"ours": "1"},
                                                "lines": [{"type": "invoice_line_item", "invoice_line_item": second,
                                                           "amount": 200}]})
    assert (pre.amount, pre.type, pre.pre_payment_amount, pre.status) == (200, "pre_payment", 200, "issued")
    assert pre.lines.data[0].invoice_line_item == second and pre.metadata["ours"] == "1"
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 1050
    stripe_fake.pay(stripe_api_key, invoice.id)
    # paid: what is credited now must be refunded, credited to the balance or marked out of band
    with pytest.raises(stripe.InvalidRequestError, match="post-payment amount"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "lines": [
            {"type": "custom_line_item", "description": "goodwill", "unit_amount": 300}]})
    post = client.v1.credit_notes.create(params={"invoice": invoice.id, "refund_amount": 300, "lines": [
        {"type": "custom_line_item", "description": "goodwill", "unit_amount": 300}]})
    assert (post.amount, post.type, post.post_payment_amount) == (300, "post_payment", 300)
    # at most the invoice total less earlier credit notes (1250 - 200 - 300 = 750 left)
    with pytest.raises(stripe.InvalidRequestError, match=r"exceeds what is left to credit on invoice"):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "refund_amount": 751, "lines": [
            {"type": "custom_line_item", "description": "too much", "unit_amount": 751}]})
    listed = client.v1.credit_notes.list(params={"invoice": invoice.id, "limit": 1})
    assert listed.has_more and {n.id for n in listed.auto_paging_iter()} == {pre.id, post.id}
    assert client.v1.credit_notes.retrieve(pre.id).amount == 200
    lines = client.v1.invoices.line_items.list(invoice.id, params={"limit": 1})
    assert [line.id for line in lines.auto_paging_iter()] == [first, second]


def test_credit_notes_need_a_finalized_invoice_and_keys_are_idempotent(client, stripe_fake, stripe_api_key):
    customer = _customer(client)
    client.v1.invoice_items.create(params={"customer": customer.id, "amount": 900, "currency": "jpy"})
    draft = client.v1.invoices.create(params={"customer": customer.id, "currency": "jpy",
                                              "pending_invoice_items_behavior": "include"})
    line = {"type": "invoice_line_item", "invoice_line_item": draft.lines.data[0].id, "amount": 900}
    with pytest.raises(stripe.InvalidRequestError, match="finalized"):
        client.v1.credit_notes.create(params={"invoice": draft.id, "lines": [line]})
    client.v1.invoices.finalize_invoice(draft.id)
    first = client.v1.credit_notes.create(params={"invoice": draft.id, "lines": [line]},
                                          options={"idempotency_key": "cn-1"})
    again = client.v1.credit_notes.create(params={"invoice": draft.id, "lines": [line]},
                                          options={"idempotency_key": "cn-1"})
    assert again.id == first.id and first.amount == 900 and first.currency == "jpy"
    with pytest.raises(stripe.IdempotencyError):
        client.v1.credit_notes.create(params={"invoice": draft.id, "lines": [{**line, "amount": 899}]},
                                      options={"idempotency_key": "cn-1"})
    assert stripe_fake.count(stripe_api_key, "credit_note") == 1
