"""The billing commands: `infermeter customers|plans|billing|invoices|invoice|credits|stripe|export ...`.

Each command opens the configured database (DATABASE_URL, a running `infermeter up`, or embedded
PostgreSQL for its own duration) in autocommit mode; the service functions own their transactions.
Bad input raises a ValueError with a clear message: `app.cli.main` prints it as one `error: ...`
line (exit 2). A billing run with unbilled usage, and a reconcile that finds a difference, exit 1.
The commands act at `clock()`: the system clock, or the one set in `CLOCK` for the caller's context
(the tests run the commands in-process under a frozen clock that way).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from infermeter.settings import get_settings
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import parse_time, utc_now

console = Console()
err = Console(stderr=True)


# The clock the commands pass as `now`. A caller that runs them in-process under another clock sets it
# for its own context (`token = CLOCK.set(fn)` ... `CLOCK.reset(token)`); nothing else changes it.
CLOCK: ContextVar[Callable[[], datetime]] = ContextVar("infermeter_billing_cli_clock", default=utc_now)


def clock() -> datetime:
    return CLOCK.get()()


customers_app = typer.Typer(help="Billed customers: time zone, currency, billing anchor day.", no_args_is_help=True)
plans_app = typer.Typer(help="Which price book a customer is billed under, from which date.", no_args_is_help=True)
billing_app = typer.Typer(help="Billing runs (draft, refresh, finalize invoices) and money reconciliation.",
                          no_args_is_help=True)
invoices_app = typer.Typer(help="Invoices: list, show, void and reissue, credit notes.", no_args_is_help=True)
invoice_app = typer.Typer(help="Preview a customer's invoice.", no_args_is_help=True)
credits_app = typer.Typer(help="Prepaid credits: grants and the ledger.", no_args_is_help=True)
stripe_app = typer.Typer(help="Push finalized invoices to Stripe; what Stripe knows of each.", no_args_is_help=True)
export_app = typer.Typer(help="Finance exports (CSV or Parquet), reproducible as of any past moment.",
                         no_args_is_help=True)

APPS = {"customers": customers_app, "plans": plans_app, "billing": billing_app, "invoices": invoices_app,
        "invoice": invoice_app, "credits": credits_app, "stripe": stripe_app, "export": export_app}


def _has_projects(lines: list[dict]) -> bool:
    """Whether an invoice's lines are split by project (a project column is shown then; '-' : none)."""
    return any(line.get("project") for line in lines)


def _print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


@contextmanager
def _connect() -> Iterator[psycopg.Connection]:
    with _connect_with_url() as (conn, _):
        yield conn


@contextmanager
def _connect_with_url() -> Iterator[tuple[psycopg.Connection, str]]:
    """An autocommit connection and the database URL (for SQLAlchemy engines)."""
    settings = get_settings()
    with open_stack(settings, broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url),
                                                                      autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn, stack.database_url


def _cost_model():
    from pricing_service.books import read_cost_model

    return read_cost_model(get_settings().pricing_cost_model)


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the price book: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- customers


@customers_app.command("set")
def customers_set(
    customer_id: Annotated[str, typer.Argument(help="The customer id metering uses (events' customer_id).")],
    name: Annotated[str | None, typer.Option(help="Display name.")] = None,
    email: Annotated[str | None, typer.Option(help="Billing e-mail address.")] = None,
    timezone: Annotated[str | None, typer.Option(help="IANA time zone of its billing periods (default UTC).")] = None,
    currency: Annotated[str | None, typer.Option(help="ISO 4217 currency it is billed in (default USD).")] = None,
    anchor_day: Annotated[int | None, typer.Option("--anchor-day", help="Day of the month its periods start (1..31, default 1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create a customer or update the fields given."""
    from billing_service.customers import set_customer

    with _connect() as conn:
        customer, changed = set_customer(conn, customer_id, now=clock(), name=name, email=email, timezone=timezone,
                                         currency=currency, anchor_day=anchor_day)
    if as_json:
        _print_json({**customer.to_json(), "changed": changed})
    else:
        console.print(f"customer {customer.customer_id}: {customer.timezone}, {customer.currency}, anchor day "
                      f"{customer.anchor_day}{'' if changed else ' (unchanged)'}")


@customers_app.command("show")
def customers_show(
    customer_id: Annotated[str, typer.Argument(help="Customer id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A customer and its plans."""
    from billing_service.store import plans, require_customer

    with _connect() as conn:
        customer = require_customer(conn, customer_id)
        assigned = plans(conn, customer_id)
    payload = {**customer.to_json(), "plans": [p.to_json() for p in assigned]}
    if as_json:
        _print_json(payload)
        return
    console.print(f"customer {customer.customer_id} ({customer.name or '-'}, {customer.email or '-'}): "
                  f"{customer.timezone}, {customer.currency}, anchor day {customer.anchor_day}")
    for p in assigned:
        console.print(f"  plan {p.book_id} from {p.from_date} (effective period {p.effective_period})")


@customers_app.command("list")
def customers_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Every billed customer."""
    from billing_service.store import all_customers

    with _connect() as conn:
        found = [c.to_json() for c in all_customers(conn)]
    if as_json:
        _print_json({"customers": found})
        return
    table = Table("customer", "name", "time zone", "currency", "anchor day")
    for c in found:
        table.add_row(c["customer_id"], c["name"] or "", c["timezone"], c["currency"], str(c["anchor_day"]))
    console.print(table)


# ---------------------------------------------------------------- plans


@plans_app.command("assign")
def plans_assign(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    price_book: Annotated[Path, typer.Option("--price-book", help="Price book YAML (stored as an immutable snapshot).")],
    from_date: Annotated[str, typer.Option("--from", help="Local date YYYY-MM-DD; in force from the first period boundary at or after it.")],
    backdate: Annotated[bool, typer.Option("--backdate", help="Allow --from before the customer's first plan (the periods in between are billed too).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Bill a customer under a price book from a date (a change inside a period applies from the next one)."""
    from billing_service.customers import assign_plan

    text = _read_text(price_book)
    with _connect() as conn:
        result = assign_plan(conn, customer, text, str(price_book), from_date, now=clock(), backdate=backdate)
    payload = {"customer_id": customer, "price_book": result.book.book.id, "price_book_version": result.book.version,
               "from": from_date, "effective_period": result.effective.label,
               "effective_at": result.effective.start.isoformat().replace("+00:00", "Z"), "created": result.created}
    if as_json:
        _print_json(payload)
    else:
        state = "assigned" if result.created else "already assigned"
        console.print(f"{customer}: {result.book.book.id} {state}, in force from period {result.effective.label} "
                      f"({payload['effective_at']})")


@plans_app.command("list")
def plans_list(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A customer's plan assignments, oldest first."""
    from billing_service.store import plans, require_customer

    with _connect() as conn:
        require_customer(conn, customer)
        found = [p.to_json() for p in plans(conn, customer)]
    if as_json:
        _print_json({"plans": found})
        return
    table = Table("from", "effective period", "price book", "version", "assigned at")
    for p in found:
        table.add_row(p["from"], p["effective_period"], p["price_book"], p["price_book_version"][-12:], p["assigned_at"])
    console.print(table)


# ---------------------------------------------------------------- billing run and reconcile


@billing_app.command("run")
def billing_run_cmd(
    period: Annotated[str, typer.Option("--period", help="Billing period YYYY-MM (the month it starts in, per customer).")],
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer.")] = None,
    allow_unbilled: Annotated[bool, typer.Option("--allow-unbilled", help="Exit 0 even if some usage has no customer or plan.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create or refresh each customer's draft invoice for a period; finalize it once the grace window is over."""
    from billing_service.run import billing_run

    settings = get_settings()
    with _connect() as conn:
        result = billing_run(conn, period, now=clock(), customer_id=customer, grace_h=settings.billing_grace_h,
                             cost_model=_cost_model(), issuer_prefix=settings.billing_issuer_prefix)
    if as_json:
        _print_json(result.to_json())
    else:
        table = Table("customer", "period", "invoice", "number", "status", "action", "total")
        for o in result.invoices:
            table.add_row(o.customer_id, o.period, o.invoice_id, o.number or "", o.status, o.action,
                          f"{o.to_json()['total']} {o.currency}")
        console.print(table)
        for o in result.invoices:
            if o.note:
                err.print(f"{o.invoice_id}: {o.note}", highlight=False, soft_wrap=True)
        for c in result.not_started:
            console.print(f"{c}: period {period} has not started yet")
        for n in result.nothing_to_bill:
            console.print(f"{n.customer_id}: period {n.period} has nothing to bill (no usage, no minimum): no invoice",
                          highlight=False, soft_wrap=True)
    for u in result.unbilled:
        err.print(f"unbilled usage: {u.customer_id} {u.period}: {u.reason}: "
                  + ", ".join(f"{k}={v}" for k, v in u.quantities.items()), highlight=False, soft_wrap=True)
    if result.unbilled and not allow_unbilled:
        err.print(f"{len(result.unbilled)} customer(s) have unbilled usage in {period}; add customers/plans, "
                  "or pass --allow-unbilled", highlight=False)
        raise typer.Exit(1)


@billing_app.command("reconcile")
def billing_reconcile(
    period: Annotated[str, typer.Option("--period", help="Billing period YYYY-MM.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check invoices against metering: quantities = usage, invoiced + adjustments = rated usage; exit 1 on a difference."""
    from billing_service.reconcile import reconcile_money

    with _connect() as conn:
        report = reconcile_money(conn, period, cost_model=_cost_model())
    if as_json:
        _print_json(report.to_json())
    else:
        for c in report.checked:
            console.print(f"{c['customer_id']} {c['period']}: rated {c['rated']}, invoiced {c['invoiced']} "
                          f"(finalized {c['finalized']})")
        for d in report.differences:
            console.print(f"[red]difference[/]: {d.customer_id} {d.period} {d.what}: expected {d.expected}, "
                          f"found {d.found}")
        for gap in report.number_gaps:
            console.print(f"[red]number gap[/]: {gap} is missing")
        for u in report.unbilled:
            console.print(f"unbilled usage: {u.customer_id} {u.period}: {u.reason}")
        console.print("reconcile ok" if report.ok else "reconcile found differences")
    if not report.ok:
        raise typer.Exit(1)


# ---------------------------------------------------------------- invoices


@invoices_app.command("list")
def invoices_list(
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer.")] = None,
    period: Annotated[str | None, typer.Option("--period", help="Only this period (YYYY-MM).")] = None,
    status: Annotated[str | None, typer.Option("--status", help="draft, open, paid, payment_failed or void.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Invoices, by customer and period."""
    from billing_service.invoices import list_invoices

    with _connect() as conn:
        found = list_invoices(conn, customer_id=customer, period=period, status=status)
    if as_json:
        _print_json({"invoices": found})
        return
    table = Table("id", "number", "customer", "period", "status", "subtotal", "credits", "total")
    for i in found:
        table.add_row(i["id"], i["number"] or "", i["customer_id"], i["period"], i["status"], i["subtotal"],
                      i["credits_applied"], f"{i['total']} {i['currency']}")
    console.print(table)


@invoices_app.command("show")
def invoices_show(
    invoice_id: Annotated[str, typer.Argument(help="Invoice id or number.")],
    as_of: Annotated[str | None, typer.Option("--as-of", help="The invoice as it was known at this time (RFC 3339).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """An invoice with its lines, credit notes and change history."""
    from billing_service.invoices import show_invoice
    from billing_service.store import PgInvoiceStore, invoice_as_of

    with _connect() as conn:
        if as_of is not None:
            at = parse_time(as_of, "--as-of")
            stored = PgInvoiceStore(conn).get(invoice_id)
            doc = invoice_as_of(conn, stored.invoice.id, at)
            if doc is None:
                raise ValueError(f"invoice {invoice_id} did not exist yet at {as_of}")
            _print_json(doc)
            return
        shown = show_invoice(conn, invoice_id)
    if as_json:
        _print_json(shown)
        return
    console.print(f"invoice {shown['id']} {shown['number'] or '(draft)'}: {shown['customer_id']} period "
                  f"{shown['period']} [{shown['period_start']}, {shown['period_end']}) {shown['status']}")
    by_project = _has_projects(shown["lines"])
    table = Table("line", "period", "meter", "model/group", *(["project"] if by_project else []), "quantity",
                  "unit price", "amount")
    for line in shown["lines"]:
        table.add_row(line["id"], line["period"] + (" (adjustment)" if line["adjustment"] else ""), line["meter"],
                      line["group"], *([line["project"] or "-"] if by_project else []), line["quantity"],
                      line["unit_price"] or "", line["amount"])
    console.print(table)
    console.print(f"subtotal {shown['subtotal']}  credits {shown['credits_applied']}  total {shown['total']} "
                  f"{shown['currency']}  (book {shown['price_book_version']})")
    for note in shown["credit_notes"]:
        console.print(f"credit note {note['number']}: {note['total']} ({note['reason']})")


@invoices_app.command("void")
def invoices_void(
    invoice_id: Annotated[str, typer.Argument(help="Invoice id or number (open or payment_failed).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Void a finalized invoice and reissue it as a new draft (the next billing run refreshes and finalizes it)."""
    from billing_service.invoices import invoice_summary, void_invoice

    with _connect() as conn:
        voided, fresh = void_invoice(conn, invoice_id, now=clock())
    if as_json:
        _print_json({"voided": invoice_summary(voided), "reissue": invoice_summary(fresh)})
    else:
        console.print(f"{voided.number} ({voided.id}) is void; reissued as draft {fresh.id}")


@invoices_app.command("credit-note")
def invoices_credit_note(
    invoice_id: Annotated[str, typer.Argument(help="Invoice id or number (finalized).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (printed on the credit note).")],
    line: Annotated[list[str] | None, typer.Option("--line", help="Credit what is left on this line id. Repeat; none = the whole invoice.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Issue a credit note against a finalized invoice (whole, or by line)."""
    from billing_service.credits import issue_credit_note
    from billing_service.store import money_text

    with _connect() as conn:
        note, number = issue_credit_note(conn, invoice_id, reason=reason, now=clock(), line_ids=line or None)
    payload = {"id": note.id, "number": number, "invoice_id": note.invoice_id, "currency": note.currency,
               "total": money_text(note.total, note.currency),
               "refund_amount": money_text(note.refund_amount, note.currency),
               "credits_returned": money_text(note.credits_returned, note.currency), "reason": note.reason,
               "lines": [{"invoice_line_id": x.invoice_line_id, "amount": money_text(x.amount, note.currency)}
                         for x in note.lines]}
    if as_json:
        _print_json(payload)
    else:
        console.print(f"credit note {number}: {payload['total']} {note.currency} against {note.invoice_id}")


# ---------------------------------------------------------------- preview


@invoice_app.command("preview")
def invoice_preview(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    period: Annotated[str, typer.Option("--period", help="Billing period YYYY-MM.")],
    price_book: Annotated[Path | None, typer.Option("--price-book", help="Preview under this price book instead of the plan's.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """What the customer's invoice would be now (period to date when the period is not over)."""
    from billing_service.invoices import preview_invoice

    book = (_read_text(price_book), str(price_book)) if price_book is not None else None
    with _connect() as conn:
        shown = preview_invoice(conn, customer, period, now=clock(), cost_model=_cost_model(), book=book)
    if as_json:
        _print_json(shown)
        return
    console.print(f"{customer} {period} [{shown['period_start']}, {shown['period_end']}) {shown['note']}")
    by_project = _has_projects(shown["lines"])
    table = Table("meter", "model/group", *(["project"] if by_project else []), "period", "quantity", "unit price",
                  "amount")
    for line in shown["lines"]:
        table.add_row(line["meter"], line["group"], *([line["project"] or "-"] if by_project else []), line["period"],
                      line["quantity"], line["unit_price"] or "", line["amount"])
    console.print(table)
    console.print(f"subtotal {shown['subtotal']}  credits {shown['credits_applied']}  total {shown['total']} "
                  f"{shown['currency']}")


# ---------------------------------------------------------------- credits


@credits_app.command("grant")
def credits_grant(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    amount: Annotated[str, typer.Option("--amount", help="Amount in the customer's currency, e.g. 50.00.")],
    expires: Annotated[str | None, typer.Option("--expires", help="Local date YYYY-MM-DD from which it can no longer be used.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (default: prepaid credit).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Grant prepaid credit; it pays invoices at finalization, oldest-expiring first."""
    from billing_service.credits import grant_credits
    from billing_service.store import money_text

    with _connect() as conn:
        grant = grant_credits(conn, customer, amount, now=clock(), expires=expires, reason=reason)
    payload = {"id": grant.id, "customer_id": grant.customer_id, "currency": grant.currency,
               "amount": money_text(grant.amount, grant.currency),
               "granted_at": grant.granted_at.isoformat().replace("+00:00", "Z"),
               "expires_at": grant.expires_at and grant.expires_at.isoformat().replace("+00:00", "Z"),
               "reason": grant.reason}
    if as_json:
        _print_json(payload)
    else:
        console.print(f"granted {payload['amount']} {grant.currency} to {customer} ({grant.id})"
                      + (f", expires {payload['expires_at']}" if grant.expires_at else ""))


@credits_app.command("show")
def credits_show(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A customer's prepaid credits: every grant, use and expiry, and the balance now."""
    from billing_service.credits import credits_view

    with _connect() as conn:
        view = credits_view(conn, customer, now=clock())
    if as_json:
        _print_json(view)
        return
    table = Table("at", "kind", "grant", "amount", "invoice")
    for e in view["ledger"]:
        table.add_row(e["at"], e["kind"] + ("" if e["recorded"] else " (due)"), e["grant_id"], e["amount"],
                      e["invoice_id"] or "")
    console.print(table)
    console.print(f"balance {view['balance']} {view['currency']}")


# ---------------------------------------------------------------- Stripe


@stripe_app.command("sync")
def stripe_sync(
    period: Annotated[str | None, typer.Option("--period", help="Only invoices of this period (YYYY-MM).")] = None,
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Push every finalized (and void) invoice not yet in sync to Stripe, oldest first per customer; exit 1 on a failure.

    First, customers already in Stripe whose name or e-mail changed locally (`customers set`) are updated there.

    Uses INFERMETER_STRIPE_API_KEY (required) and INFERMETER_STRIPE_API_BASE; what was pushed is recorded in
    stripe_objects, so a rerun (after a crash too) creates nothing twice."""
    from billing_service.stripe.run import sync_invoices
    from billing_service.stripe.state import PostgresSyncState
    from billing_service.stripe.sync import StripeSync, stripe_client
    from infermeter.db import get_engine

    settings = get_settings()
    if not settings.stripe_api_key:
        raise ValueError("INFERMETER_STRIPE_API_KEY is not set: `stripe sync` needs the Stripe secret key (sk_...); "
                         "set INFERMETER_STRIPE_API_BASE too to use a local Stripe (localstripe, a fake)")
    client = stripe_client(settings.stripe_api_key, settings.stripe_api_base)
    with _connect_with_url() as (conn, url):
        report = sync_invoices(conn, StripeSync(client, PostgresSyncState(get_engine(url))), period=period,
                               customer_id=customer)
    if as_json:
        _print_json(report.to_json())
    else:
        for i in report.invoices:
            console.print(f"{i.number or i.invoice_id} {i.customer_id} {i.period} {i.status}: {i.outcome}"
                          + (f" (Stripe {i.stripe_invoice}, {i.stripe_status})" if i.outcome == "pushed" else ""),
                          highlight=False, soft_wrap=True)
        for c in report.customers:
            console.print(f"customer {c.customer_id} (Stripe {c.stripe_customer}): name and e-mail {c.outcome}",
                          highlight=False, soft_wrap=True)
        for n in report.credit_notes:
            console.print(f"credit note {n.number or n.credit_note_id} on {n.invoice_number}: {n.outcome} ({n.note}"
                          + (f"; Stripe {n.stripe_credit_note}" if n.stripe_credit_note else "") + ")",
                          highlight=False, soft_wrap=True)
        for n in report.credit_notes:
            if n.error:
                err.print(f"credit note {n.number or n.credit_note_id}: {n.outcome}: {n.error}", highlight=False,
                          soft_wrap=True)
        for i in report.invoices:
            if i.error:
                err.print(f"{i.number or i.invoice_id}: {i.outcome}: {i.error}", highlight=False, soft_wrap=True)
        for c in report.customers:
            if c.error:
                err.print(f"customer {c.customer_id}: {c.outcome}: {c.error}", highlight=False, soft_wrap=True)
        notes = report.to_json()["credit_notes_pushed"]
        console.print(f"pushed {report.count('pushed')}, already in sync {report.count('in_sync')}, failed "
                      f"{report.count('failed')}, skipped {report.count('skipped')}; credit notes pushed {notes}")
    if not report.ok:
        raise typer.Exit(1)


@stripe_app.command("status")
def stripe_status(
    period: Annotated[str | None, typer.Option("--period", help="Only invoices of this period (YYYY-MM).")] = None,
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per finalized or void invoice and per credit note: the Stripe ids recorded, in sync or not (no call to Stripe)."""
    from billing_service.stripe.run import credit_note_status, sync_status

    with _connect() as conn:
        found = sync_status(conn, period=period, customer_id=customer)
        notes = credit_note_status(conn, period=period, customer_id=customer)
    if as_json:
        _print_json({"invoices": found, "credit_notes": notes})
        return
    for i in found:  # one line each (a wide table would be cut in a terminal)
        console.print(f"{i['number'] or i['id']} {i['customer_id']} {i['period']} {i['status']}: "
                      f"{'in sync' if i['in_sync'] else 'NOT in sync'} ({i['note']}; Stripe "
                      f"{i['stripe_invoice'] or '-'}, customer {i['stripe_customer'] or '-'}, items "
                      f"{i['stripe_items']}/{i['items_expected']})", highlight=False, soft_wrap=True)
    for n in notes:
        console.print(f"credit note {n['number']} on {n['invoice_number']} {n['customer_id']} {n['total']} "
                      f"(in Stripe {n['stripe_amount']}): {'in sync' if n['in_sync'] else 'NOT in sync'} "
                      f"({n['note']}; Stripe {n['stripe_credit_note'] or '-'})", highlight=False, soft_wrap=True)
    if not found:
        console.print("no finalized invoices")


# ---------------------------------------------------------------- finance exports


def _export_command(kind: str, summary: str) -> None:
    @export_app.command(kind, help=summary + " Same bytes for the same --as-of, whenever it is run; see docs/billing.md.")
    def command(
        period: Annotated[str, typer.Option("--period", help="Billing period YYYY-MM.")],
        fmt: Annotated[str, typer.Option("--format", help="csv or parquet.")] = "csv",
        out: Annotated[Path | None, typer.Option("--out", help="Write to this file (default: standard output).")] = None,
        as_of: Annotated[str | None, typer.Option("--as-of", help="What was known at this time (RFC 3339); default: everything recorded so far.")] = None,
    ) -> None:
        from billing_service.exports import check_format, export

        check_format(fmt)
        at = parse_time(as_of, "--as-of") if as_of is not None else None
        if out is None and fmt == "parquet" and sys.stdout.isatty():
            raise ValueError("Parquet is binary: give --out FILE (or redirect standard output)")
        with _connect() as conn:
            data = export(conn, kind, period, fmt, at)
        if out is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        else:
            try:
                Path(out).write_bytes(data)
            except OSError as exc:
                raise ValueError(f"{out}: cannot write the export: {exc.strerror or exc}") from None
            err.print(f"{kind} {period}: {len(data)} bytes written to {out}", highlight=False, soft_wrap=True)

    command.__name__ = f"export_{kind}"


_export_command("invoices", "Invoices of a period (one row each, as known then).")
_export_command("lines", "Invoice lines of a period's invoices.")
_export_command("revenue", "Revenue of a service period by customer, model, meter and the period invoiced in.")
_export_command("usage", "Metered usage of a period by customer, meter, model and deployment.")
