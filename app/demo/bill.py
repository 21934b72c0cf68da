"""The demo's billing: customers and plans, prepaid credit, the month's billing run as of a fixed
instant, the invoices, the money reconcile and the finance exports."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from app.demo.month import CUSTOMERS
from infermeter.stack.postgres import to_libpq_url

# Billing runs as of this instant: after the month and its 24 h grace window, so invoices finalize.
BILLING_AS_OF = datetime(2026, 12, 3, tzinfo=UTC)
BILLING_SETUP_AT = datetime(2026, 10, 25, tzinfo=UTC)
NON_UTC_CUSTOMER = ("cust-002", "Asia/Kolkata")  # its November is [Oct 31 18:30Z, Nov 30 18:30Z)
PREPAID_CUSTOMER = ("cust-003", "10.00")  # USD of prepaid credit, granted before the month


def demo_billing_clock() -> datetime:
    """The instant the served dashboards show billing figures (current-period preview, credit balance)
    as of: BILLING_AS_OF while the clock is earlier, else now. The month is billed as of BILLING_AS_OF,
    so with a clock before it the pages would show cust-003's prepaid credit as not yet used while the
    demo's own invoice table shows it applied."""
    return max(datetime.now(UTC), BILLING_AS_OF)


def bill_month(database_url: str, start: datetime, out_dir: Path, console: Console) -> dict:
    """Customers and plans (the per-token book from the month's first day; one customer in
    Asia/Kolkata, one with prepaid credit), the month's billing run as of BILLING_AS_OF (drafts,
    then finalized with gapless numbers), the invoices, money reconciled, the finance exports."""
    from billing_service.credits import grant_credits
    from billing_service.customers import assign_plan, set_customer
    from billing_service.exports import export
    from billing_service.invoices import list_invoices
    from billing_service.reconcile import reconcile_money
    from billing_service.run import billing_run
    from billing_service.store import get_customer, money_text
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    period = f"{start:%Y-%m}"
    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    text = book.read_text()
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        for k in range(1, CUSTOMERS + 1):
            customer = f"cust-{k:03d}"
            if get_customer(conn, customer) is not None:
                continue  # set up by an earlier demo run on this home: its invoices are final
            zone = NON_UTC_CUSTOMER[1] if customer == NON_UTC_CUSTOMER[0] else None
            set_customer(conn, customer, now=BILLING_SETUP_AT, name=f"Demo customer {k}", timezone=zone)
            assign_plan(conn, customer, text, str(book), f"{start:%Y-%m-%d}", now=BILLING_SETUP_AT)
            if customer == PREPAID_CUSTOMER[0]:
                grant_credits(conn, customer, PREPAID_CUSTOMER[1], now=BILLING_SETUP_AT, reason="demo top-up")
            conn.commit()
        result = billing_run(conn, period, now=BILLING_AS_OF)
        conn.commit()
        check = reconcile_money(conn, period)
        files = {}
        for kind, fmt in (("invoices", "csv"), ("lines", "csv"), ("revenue", "csv"), ("revenue", "parquet")):
            path = out_dir / f"{kind}-{period}.{fmt}"
            path.write_bytes(export(conn, kind, period, fmt))
            files[f"{kind}.{fmt}"] = str(path)
        # the period's invoices as stored (a rerun finds them final and changes nothing)
        invoices = list_invoices(conn, period=period)
    table = Table(title=f"Invoices for {period} (as of {BILLING_AS_OF:%Y-%m-%d}; top 8 by total)")
    for column in ("number", "customer", "status", "subtotal", "credits", "total"):
        table.add_column(column, justify="right" if column in ("subtotal", "credits", "total") else "left")
    for o in sorted(invoices, key=lambda o: (-Decimal(o["total"]), o["customer_id"]))[:8]:
        table.add_row(o["number"] or "-", o["customer_id"], o["status"], o["subtotal"], o["credits_applied"], o["total"])
    console.print(table)
    total = money_text(sum((Decimal(o["total"]) for o in invoices), Decimal(0)), "USD")
    credits = money_text(sum((Decimal(o["credits_applied"]) for o in invoices), Decimal(0)), "USD")
    status = "[green]ok[/]" if check.ok else f"[red]{len(check.differences)} differences[/]"
    console.print(f"{len(invoices)} invoices, {total} USD to collect after {credits} USD of prepaid credit; "
                  f"{NON_UTC_CUSTOMER[0]} is billed on {NON_UTC_CUSTOMER[1]} days; money reconcile {status}; "
                  f"exports in {out_dir}")
    if not check.ok:
        raise RuntimeError("demo: invoices do not reconcile with rated usage (see above)")
    return {"period": period, "invoices": len(invoices), "total": total, "credits_applied": credits,
            "finalized": sum(1 for o in invoices if o["status"] == "open"), "reconcile_ok": check.ok,
            "unbilled": [u.customer_id for u in result.unbilled], "exports": files}
