"""Push finalized invoices to Stripe, exactly once, whatever crashes in between.

`StripeSync(client, state)`: `sync_customer(customer)` then `sync_invoice(invoice, customer)`:

1. the customer (name, email; metadata `infermeter_customer_id`, `infermeter_currency`);
2. one invoice item per invoice line, amount in integer minor units of the invoice currency
   (`billing.stripe_keys.to_minor_units`: JPY 0 places, BHD 3; never rounded here), metadata
   `infermeter_invoice_id`, `infermeter_line_id`, `infermeter_period`; prepaid credits applied to the
   invoice become one more, negative item (line id `prepaid-credits`) so the Stripe total is the
   invoice total;
3. the Stripe invoice for those pending items (`pending_invoice_items_behavior=include`,
   `auto_advance=false`, `number` = the infermeter number), checked to total exactly the invoice;
4. finalize it (`auto_advance=true`: Stripe collects, and reports back through webhooks);
5. void it when the local invoice is void;
6. each credit note of a finalized invoice, once its Stripe invoice is finalized (`sync_credit_note`):
   a Stripe credit note for what the note gives back of what the invoice charged
   (`CreditNote.refund_amount`, in minor units); prepaid credits it returns stay ours.

Exactly once, two ways together:
- every POST carries an idempotency key derived from the invoice and line ids (`billing.stripe_keys`):
  a crash between Stripe doing the call and us recording it is healed by the rerun sending the same
  key (Stripe answers the first response again, for 24 hours);
- each created object id is recorded in `SyncState` before the next call, so a rerun skips what is done;
  and before creating, the adapter looks for an object it made earlier by listing (customers by email,
  the customer's invoice items and invoices) and matching the `infermeter_*` metadata — that covers a
  lost record older than Stripe's 24 hours of idempotency keys.

Before creating the invoice the customer's pending items must be exactly this invoice's items (an item
of another invoice would be swept into it): otherwise `StripeSyncError`, and nothing is created.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from decimal import Decimal
from typing import Any

import stripe

from billing.credit_notes import CreditNote
from billing.invoice import Invoice, InvoiceLine, InvoiceStatus
from billing.stripe_keys import (
    credit_note_key,
    customer_update_key,
    finalize_key,
    from_minor_units,
    idempotency_key,
    invoice_item_key,
    invoice_key,
    to_minor_units,
    void_key,
)
from billing_service.stripe.state import SyncState

CREDITS_LINE_ID = "prepaid-credits"
META_CUSTOMER = "infermeter_customer_id"
META_CURRENCY = "infermeter_currency"
META_INVOICE = "infermeter_invoice_id"
META_LINE = "infermeter_line_id"
META_PERIOD = "infermeter_period"
META_NUMBER = "infermeter_number"
META_CREDIT_NOTE = "infermeter_credit_note_id"
META_CREDIT_NOTE_NUMBER = "infermeter_credit_note_number"
STRIPE_CREDITABLE = ("open", "paid", "uncollectible")  # Stripe invoice statuses that take a credit note
PAGE = 100  # objects per list request (Stripe's maximum)


class StripeSyncError(RuntimeError):
    """Stripe holds something that does not match the local invoice; nothing further was pushed."""


@dataclass(frozen=True)
class CustomerInfo:
    id: str
    name: str
    email: str | None
    currency: str  # ISO 4217, upper case as in infermeter ("USD")
    version: str | None = None  # of the name and e-mail (`stripe.run.customer_version`): None, not tracked


@dataclass(frozen=True)
class ItemSpec:
    """One Stripe invoice item to create for an invoice."""

    line_id: str
    amount_minor: int
    description: str
    period: str

    def local_id(self, invoice_id: str) -> str:
        return f"{invoice_id}/{self.line_id}"


@dataclass
class SyncResult:
    customer: str
    items: dict[str, str] = field(default_factory=dict)  # line id -> ii_...
    invoice: str | None = None
    status: str | None = None  # the Stripe invoice status after the sync


def stripe_client(api_key: str, api_base: str | None = None, **kwargs: Any) -> stripe.StripeClient:
    """A StripeClient for INFERMETER_STRIPE_API_KEY / INFERMETER_STRIPE_API_BASE."""
    if not api_key:
        raise ValueError("INFERMETER_STRIPE_API_KEY is not set: the Stripe adapter needs a secret key (sk_...)")
    base = {"api": api_base.rstrip("/")} if api_base else None
    return stripe.StripeClient(api_key, base_addresses=base, **kwargs)


def _get(obj: Any, name: str) -> Any:
    """A field of a StripeObject (or dict), None if absent."""
    try:
        return obj[name]
    except (KeyError, TypeError):
        return None


def _meta(obj: Any) -> dict[str, str]:
    meta = _get(obj, "metadata")
    if meta is None:
        return {}
    return dict(meta.to_dict() if hasattr(meta, "to_dict") else meta)


def item_specs(invoice: Invoice) -> list[ItemSpec]:
    """The invoice items of an invoice: its lines, then the prepaid credits applied (negative)."""
    money = invoice.money
    specs = [
        ItemSpec(line.id, to_minor_units(line.amount, money), _describe(line), line.period) for line in invoice.lines
    ]
    if invoice.credits_applied:
        specs.append(
            ItemSpec(CREDITS_LINE_ID, -to_minor_units(invoice.credits_applied, money), "Prepaid credits applied",
                     invoice.period)
        )
    return specs


def credit_note_amount_minor(note: CreditNote, invoice: Invoice) -> int:
    """What a credit note gives back in Stripe, in minor units: the part of it that gives back what the
    invoice charged (`refund_amount`). The part returned to prepaid credits (`credits_returned`) never
    reached Stripe (the credits were a negative item there), so it is not credited there. 0: no Stripe
    credit note (the invoice charged nothing in Stripe, or earlier notes gave it all back)."""
    if note.invoice_id != invoice.id:
        raise ValueError(f"credit note {note.id} is for invoice {note.invoice_id}, not {invoice.id}")
    return to_minor_units(note.refund_amount, invoice.money)


def _describe(line: InvoiceLine) -> str:
    what = line.meter + (f" {line.group}" if line.group else "") + (f" project {line.project}" if line.project else "")
    adjustment = " (adjustment)" if line.is_adjustment else ""
    return f"{what}: {line.quantity.normalize():f} ({line.period}){adjustment}"


class StripeSync:
    def __init__(self, client: stripe.StripeClient, state: SyncState, *, page_size: int = PAGE) -> None:
        self.client = client
        self.state = state
        self.v1 = client.v1
        self.page_size = page_size  # objects per list request when it looks Stripe's lists through

    # ------------------------------------------------------------ customers

    def sync_customer(self, customer: CustomerInfo) -> str:
        """The Stripe customer id of an infermeter customer, created once."""
        key = idempotency_key("customer", customer.id)
        done = self.state.get("customer", customer.id)
        if done is not None:
            return done.stripe_id
        found = self._find_customer(customer)
        if found is None:
            params: dict[str, Any] = {
                "name": customer.name,
                "metadata": {META_CUSTOMER: customer.id, META_CURRENCY: customer.currency.upper()},
            }
            if customer.email:
                params["email"] = customer.email
            found = self.v1.customers.create(params=params, options={"idempotency_key": key}).id
            if customer.version is not None:  # created with this name and e-mail: push number 0
                self.state.record("customer_update", f"{customer.id}@0", found,
                                  customer_update_key(customer.id, 0, customer.version))
        self.state.record("customer", customer.id, found, key)
        return found

    def update_customer(self, customer: CustomerInfo, push: int) -> bool:
        """Push the customer's name and e-mail to its Stripe customer as the customer's `push`-th update
        (the caller gives one more than the last recorded, `stripe.run.sync_customers`):
        `POST /v1/customers/{id}` with the idempotency key of (customer, push, version), so a rerun
        after a lost answer sends the same key and Stripe does it once, while a later change (or a
        change back to earlier values) is a new push with a new key. An e-mail removed locally is
        removed in Stripe too. False when there is nothing to push: the customer is not in Stripe yet
        (it is created with these values when its first invoice is pushed), it has no version, or this
        push is already recorded."""
        done = self.state.get("customer", customer.id)
        if done is None or customer.version is None:
            return False
        local_id = f"{customer.id}@{push}"
        if self.state.get("customer_update", local_id) is not None:
            return False
        key = customer_update_key(customer.id, push, customer.version)
        self.v1.customers.update(done.stripe_id, params={"name": customer.name, "email": customer.email or ""},
                                 options={"idempotency_key": key})
        self.state.record("customer_update", local_id, done.stripe_id, key)
        return True

    def _find_customer(self, customer: CustomerInfo) -> str | None:
        if not customer.email:  # customers are listed by email only; the idempotency key is the guard
            return None
        matches = [
            c.id for c in self._all(self.v1.customers.list, {"email": customer.email})
            if _meta(c).get(META_CUSTOMER) == customer.id
        ]
        if len(matches) > 1:
            raise StripeSyncError(
                f"customer {customer.id} exists {len(matches)} times in Stripe ({', '.join(matches)}): "
                f"delete the extra ones, then rerun"
            )
        return matches[0] if matches else None

    # ------------------------------------------------------------ invoice items

    def sync_items(self, invoice: Invoice, stripe_customer: str) -> dict[str, str]:
        """One pending invoice item per line (and prepaid credits), created once; line id -> ii_..."""
        _require_finalized(invoice)
        currency = invoice.currency.lower()
        out: dict[str, str] = {}
        existing: dict[str, list[Any]] | None = None
        for spec in item_specs(invoice):
            key = invoice_item_key(invoice.id, spec.line_id, _signed(spec, invoice), invoice.currency)
            local_id = spec.local_id(invoice.id)
            done = self.state.get("invoiceitem", local_id)
            if done is not None:
                if done.idempotency_key != key:
                    raise StripeSyncError(
                        f"invoice item {local_id} was pushed as {done.stripe_id} with key {done.idempotency_key}, "
                        f"but the line now gives key {key}: a finalized invoice never changes; investigate"
                    )
                out[spec.line_id] = done.stripe_id
                continue
            if existing is None:
                existing = self._items_by_line(invoice.id, stripe_customer)
            found = existing.get(spec.line_id, [])
            if len(found) > 1:
                raise StripeSyncError(
                    f"line {spec.line_id} of invoice {invoice.id} has {len(found)} Stripe items "
                    f"({', '.join(i.id for i in found)}): delete the extra ones, then rerun"
                )
            if found:
                item = found[0]
                if (_get(item, "amount"), _get(item, "currency")) != (spec.amount_minor, currency):
                    raise StripeSyncError(
                        f"Stripe item {item.id} for line {spec.line_id} of invoice {invoice.id} is "
                        f"{_get(item, 'amount')} {_get(item, 'currency')}, expected {spec.amount_minor} {currency}"
                    )
                stripe_id = item.id
            else:
                stripe_id = self.v1.invoice_items.create(
                    params={
                        "customer": stripe_customer,
                        "amount": spec.amount_minor,
                        "currency": currency,
                        "description": spec.description,
                        "metadata": {META_INVOICE: invoice.id, META_LINE: spec.line_id, META_PERIOD: spec.period},
                    },
                    options={"idempotency_key": key},
                ).id
            self.state.record("invoiceitem", local_id, stripe_id, key)
            out[spec.line_id] = stripe_id
        return out

    def _items_by_line(self, invoice_id: str, stripe_customer: str) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for item in self._all(self.v1.invoice_items.list, {"customer": stripe_customer}):
            meta = _meta(item)
            if meta.get(META_INVOICE) == invoice_id and META_LINE in meta:
                out.setdefault(meta[META_LINE], []).append(item)
        return out

    # ------------------------------------------------------------ invoices

    def sync_invoice(self, invoice: Invoice, customer: CustomerInfo) -> SyncResult:
        """Customer, items, invoice, finalize, and void if the local invoice is void."""
        _require_finalized(invoice)
        if customer.id != invoice.customer_id:
            raise ValueError(f"invoice {invoice.id} is for customer {invoice.customer_id}, not {customer.id}")
        result = SyncResult(customer=self.sync_customer(customer))
        stripe_invoice = self._invoice_id(invoice)
        if stripe_invoice is None:
            result.items = self.sync_items(invoice, result.customer)
            stripe_invoice = self._create_invoice(invoice, result.customer, result.items)
        result.invoice = stripe_invoice
        result.status = self._finalize(invoice, stripe_invoice)
        if invoice.status is InvoiceStatus.VOID:
            result.status = self._void(invoice, stripe_invoice)
        return result

    def _invoice_id(self, invoice: Invoice) -> str | None:
        """The Stripe invoice already made for this invoice (state, else found by metadata), or None."""
        done = self.state.get("invoice", invoice.id)
        if done is not None:
            return done.stripe_id
        customer = self.state.get("customer", invoice.customer_id)
        assert customer is not None  # sync_customer ran first
        matches = [
            inv for inv in self._all(self.v1.invoices.list, {"customer": customer.stripe_id})
            if _meta(inv).get(META_INVOICE) == invoice.id
        ]
        if len(matches) > 1:
            raise StripeSyncError(
                f"invoice {invoice.id} exists {len(matches)} times in Stripe ({', '.join(i.id for i in matches)})"
            )
        if not matches:
            return None
        self._check_total(invoice, matches[0])
        self.state.record("invoice", invoice.id, matches[0].id, invoice_key(invoice.id))
        return matches[0].id

    def _create_invoice(self, invoice: Invoice, stripe_customer: str, items: dict[str, str]) -> str:
        pending = [
            item for item in self._all(self.v1.invoice_items.list, {"customer": stripe_customer})
            if _get(item, "invoice") is None
        ]
        ours = set(items.values())
        strangers = [i.id for i in pending if i.id not in ours]
        missing = ours - {i.id for i in pending}
        if strangers or missing:
            raise StripeSyncError(
                f"customer {stripe_customer}'s pending invoice items are not exactly invoice {invoice.id}'s: "
                f"other items pending {strangers or 'none'}, ours not pending {sorted(missing) or 'none'}. "
                f"Creating the Stripe invoice would sweep them in; sync the other invoice first or remove them"
            )
        key = invoice_key(invoice.id)
        created = self.v1.invoices.create(
            params={
                "customer": stripe_customer,
                "currency": invoice.currency.lower(),
                "auto_advance": False,
                "pending_invoice_items_behavior": "include",
                "number": invoice.number,
                "description": f"infermeter {invoice.period} ({invoice.number})",
                "metadata": {
                    META_INVOICE: invoice.id,
                    META_CUSTOMER: invoice.customer_id,
                    META_PERIOD: invoice.period,
                    META_NUMBER: invoice.number or "",
                },
            },
            options={"idempotency_key": key},
        )
        self.state.record("invoice", invoice.id, created.id, key)
        self._check_total(invoice, created)
        return created.id

    def _check_total(self, invoice: Invoice, stripe_invoice: Any) -> None:
        expected = to_minor_units(invoice.total, invoice.money)
        if _get(stripe_invoice, "total") != expected or _get(stripe_invoice, "currency") != invoice.currency.lower():
            raise StripeSyncError(
                f"Stripe invoice {stripe_invoice.id} totals {_get(stripe_invoice, 'total')} "
                f"{_get(stripe_invoice, 'currency')}, invoice {invoice.id} totals {expected} {invoice.currency.lower()} "
                f"(minor units): not finalizing it"
            )

    def _finalize(self, invoice: Invoice, stripe_invoice: str) -> str:
        assert invoice.number is not None  # finalized locally
        key = finalize_key(invoice.id, invoice.number)
        if self.state.get("finalize", invoice.id) is not None:
            return self._status(invoice, stripe_invoice)
        current = self.v1.invoices.retrieve(stripe_invoice)
        if current.status == "draft":
            self._check_total(invoice, current)
            current = self.v1.invoices.finalize_invoice(
                stripe_invoice, params={"auto_advance": True}, options={"idempotency_key": key}
            )
        self.state.record("finalize", invoice.id, stripe_invoice, key)
        return current.status

    def _void(self, invoice: Invoice, stripe_invoice: str) -> str:
        key = void_key(invoice.id)
        if self.state.get("void", invoice.id) is not None:
            return "void"
        current = self.v1.invoices.retrieve(stripe_invoice)
        if current.status != "void":
            if current.status not in ("open", "uncollectible"):
                raise StripeSyncError(
                    f"invoice {invoice.id} is void here but Stripe invoice {stripe_invoice} is {current.status}: "
                    f"only an open invoice can be voided (a paid one is corrected with a credit note)"
                )
            current = self.v1.invoices.void_invoice(stripe_invoice, options={"idempotency_key": key})
        self.state.record("void", invoice.id, stripe_invoice, key)
        return current.status

    # ------------------------------------------------------------ credit notes

    def sync_credit_note(self, invoice: Invoice, note: CreditNote, number: str) -> str | None:
        """The Stripe credit note of a credit note (`number`: its CN-YYYY-NNNNNN), created once; None when
        there is nothing to credit in Stripe (`credit_note_amount_minor` is 0).

        The invoice's Stripe invoice must be finalized already (its `finalize` step recorded): a note
        waits for its invoice. Lines: when the note gives back all it credits (no prepaid credits return),
        one `invoice_line_item` line per credited line, crediting that amount of the Stripe line of its
        invoice item; otherwise one `custom_line_item` line for the amount given back, its description
        naming the whole credit and the part returned to prepaid credits. What the credit does not take
        off the Stripe invoice's `amount_remaining` (the invoice is paid) is refunded (`refund_amount`).
        Key `infermeter:creditnote:<note id>:<amount minor>`; before creating, the invoice's credit
        notes are listed and one with our `infermeter_credit_note_id` is taken (a lost record)."""
        _require_finalized(invoice)
        amount = credit_note_amount_minor(note, invoice)
        if amount == 0:
            return None
        key = credit_note_key(note.id, note.refund_amount, invoice.money)
        done = self.state.get("creditnote", note.id)
        if done is not None:
            if done.idempotency_key != key:
                raise StripeSyncError(
                    f"credit note {number} was pushed as {done.stripe_id} with key {done.idempotency_key}, but it "
                    f"now gives key {key}: a credit note never changes; investigate")
            return done.stripe_id
        finalized = self.state.get("finalize", invoice.id)
        if finalized is None:
            raise StripeSyncError(f"credit note {number} waits for invoice {invoice.number or invoice.id} "
                                  f"to be finalized in Stripe")
        stripe_invoice = finalized.stripe_id
        currency = invoice.currency.lower()
        found = [cn for cn in self._all(self.v1.credit_notes.list, {"invoice": stripe_invoice})
                 if _meta(cn).get(META_CREDIT_NOTE) == note.id]
        if len(found) > 1:
            raise StripeSyncError(f"credit note {number} exists {len(found)} times in Stripe "
                                  f"({', '.join(c.id for c in found)}): void the extra ones, then rerun")
        if found:
            _check_credit_note(found[0], number, amount, currency)
            self.state.record("creditnote", note.id, found[0].id, key)
            return found[0].id
        current = self.v1.invoices.retrieve(stripe_invoice)
        if current.status not in STRIPE_CREDITABLE:
            raise StripeSyncError(
                f"credit note {number}: Stripe invoice {stripe_invoice} of {invoice.number} is {current.status}; "
                f"Stripe takes credit notes on {', '.join(STRIPE_CREDITABLE)} invoices only")
        params: dict[str, Any] = {
            "invoice": stripe_invoice,
            "lines": self._credit_note_lines(invoice, note, stripe_invoice, amount),
            "memo": f"{number} ({utc_date(note)}): {note.reason}",
            "metadata": {META_CREDIT_NOTE: note.id, META_CREDIT_NOTE_NUMBER: number, META_INVOICE: invoice.id,
                         META_NUMBER: invoice.number or ""},
        }
        post_payment = amount - min(amount, int(_get(current, "amount_remaining") or 0))
        if post_payment:
            params["refund_amount"] = post_payment
        created = self.v1.credit_notes.create(params=params, options={"idempotency_key": key})
        self.state.record("creditnote", note.id, created.id, key)
        _check_credit_note(created, number, amount, currency)
        return created.id

    def _credit_note_lines(self, invoice: Invoice, note: CreditNote, stripe_invoice: str,
                           amount: int) -> list[dict[str, Any]]:
        money = invoice.money

        def text(value: Decimal) -> str:  # at the currency's minor unit ("3.91", "1800")
            return f"{from_minor_units(to_minor_units(value, money), money):f} {invoice.currency}"

        if note.refund_amount != note.total:  # part of it goes back to prepaid credits: one custom line
            return [{
                "type": "custom_line_item", "quantity": 1, "unit_amount": amount,
                "description": (f"{text(note.total)} credited on {invoice.number}, of which "
                                f"{text(note.credits_returned)} returned as prepaid credits"),
            }]
        by_item: dict[str, str] = {}  # ii_... -> il_...
        by_meta: dict[str, list[str]] = {}  # our line id -> il_... (a line whose item record was lost)
        for line in self._all_of(self.v1.invoices.line_items.list, stripe_invoice):
            parent = _get(line, "parent")
            details = _get(parent, "invoice_item_details") if parent is not None else None
            item = _get(details, "invoice_item") if details is not None else None
            if item:
                by_item[item] = line.id
            meta = _meta(line)
            if meta.get(META_INVOICE) == invoice.id and META_LINE in meta:
                by_meta.setdefault(meta[META_LINE], []).append(line.id)
        out = []
        for credited in note.lines:
            record = self.state.get("invoiceitem", f"{invoice.id}/{credited.invoice_line_id}")
            stripe_line = by_item.get(record.stripe_id) if record is not None else None
            if stripe_line is None and len(by_meta.get(credited.invoice_line_id, [])) == 1:
                stripe_line = by_meta[credited.invoice_line_id][0]
            if stripe_line is None:
                raise StripeSyncError(f"line {credited.invoice_line_id} of invoice {invoice.number} has no (single) "
                                      f"line on Stripe invoice {stripe_invoice}: cannot credit it there")
            out.append({"type": "invoice_line_item", "invoice_line_item": stripe_line,
                        "amount": to_minor_units(credited.amount, money)})
        return out

    def _status(self, invoice: Invoice, stripe_invoice: str) -> str:
        return self.v1.invoices.retrieve(stripe_invoice).status

    # ------------------------------------------------------------ helpers

    def _all(self, list_method: Callable[..., Any], params: dict[str, Any]) -> Iterator[Any]:
        yield from list_method(params={**params, "limit": self.page_size}).auto_paging_iter()

    def _all_of(self, list_method: Callable[..., Any], parent_id: str) -> Iterator[Any]:
        yield from list_method(parent_id, params={"limit": self.page_size}).auto_paging_iter()


def _check_credit_note(stripe_note: Any, number: str, amount: int, currency: str) -> None:
    """A Stripe credit note of credit note `number` is for `amount` minor units of `currency`."""
    if (_get(stripe_note, "amount"), _get(stripe_note, "currency")) != (amount, currency):
        raise StripeSyncError(f"Stripe credit note {stripe_note.id} for {number} is {_get(stripe_note, 'amount')} "
                              f"{_get(stripe_note, 'currency')}, expected {amount} {currency} (minor units)")


def utc_date(note: CreditNote) -> str:
    return note.issued_at.astimezone(UTC).date().isoformat()


def _signed(spec: ItemSpec, invoice: Invoice) -> Decimal:
    """The amount of a spec as a Decimal of the invoice currency (for the idempotency key)."""
    return Decimal(spec.amount_minor).scaleb(-invoice.money.minor_units)


def _require_finalized(invoice: Invoice) -> None:
    if not isinstance(invoice, Invoice):
        raise TypeError(f"expected a billing.invoice.Invoice, got {type(invoice).__name__}")
    if not invoice.status.finalized:
        raise ValueError(
            f"invoice {invoice.id} is a draft: only finalized invoices (open, paid, payment_failed, void) go to Stripe"
        )
