"""What billing shows on the dashboards, as plain data: a customer's invoices and current-period spend,
and the finance page's tables. `DashboardViews` has the shape of `dashboards.billing_views.BillingViews`
(dashboards never imports billing_service, and billing_service may not import dashboards); the roof
(app/api.py) builds one and puts it on the app's state.

Every figure comes from the functions the CLI and the API answer with: the invoices are `show_invoice`'s
(`infermeter invoices show`, GET /v1/billing/invoices/{id}), current-period spend is `preview_invoice`
(`infermeter invoice preview`, GET /v1/invoices/preview), credits are `credits_view`, and the finance
revenue tables sum `exports.revenue_rows` (the revenue export, line for line).

Customer-facing views return what the customer is invoiced only (never cost or margin), and only
the customer's own invoices: another customer's invoice id gives None (the page answers 404).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from decimal import Decimal
from typing import Protocol

import psycopg

from billing.periods import parse_label, period_containing
from billing_service.credits import credits_view
from billing_service.exports import FORMATS, KINDS, invoice_rows, revenue_rows
from billing_service.invoices import preview_invoice, show_invoice
from billing_service.store import (
    BillingServiceError,
    get_customer,
    load_book,
    money_text,
    plan_at,
    plans,
)
from pricing.book import PriceBook
from pricing.cost import CostModel

ZERO = Decimal(0)
# the invoice statuses as finance names them (open = finalized, awaiting payment)
STATUS_LABELS = {"draft": "draft", "open": "final", "paid": "paid", "payment_failed": "failed", "void": "void"}
CUSTOMER_INVOICE_KEYS = ("id", "number", "customer_id", "period", "period_start", "period_end", "sequence", "status",
                         "currency", "subtotal", "credits_applied", "total", "issued_at", "finalized_at",
                         "reissue_of", "price_book_version", "lines")
LINE_KEYS = ("id", "meter", "model", "group", "kind", "quantity", "unit_price", "amount", "period", "adjustment",
             "project")


# ---------------------------------------------------------------- the customer's page


def _customer_invoice(shown: dict) -> dict:
    out = {k: shown[k] for k in CUSTOMER_INVOICE_KEYS}
    out["status_label"] = STATUS_LABELS[shown["status"]]
    out["lines"] = [{k: line[k] for k in LINE_KEYS} for line in shown["lines"]]
    out["credit_notes"] = [{k: n[k] for k in ("number", "total", "reason", "issued_at")} for n in shown["credit_notes"]]
    return out


# ---------------------------------------------------------------- the finance page


def invoiced_periods(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT period FROM billing_invoices ORDER BY period")]


def _money(value: Decimal, currency: str) -> str:
    return money_text(value, currency)


def _grouped(rows: Iterable[dict], key: Callable[[dict], tuple], names: tuple[str, ...],
             quantity: bool = False) -> list[dict]:
    """Revenue rows summed by `key` (which ends with the currency): amount, credited, net, and the
    quantity when every row of a group has one unit (`quantity`: grouped by meter)."""
    sums: dict[tuple, dict] = {}
    for r in rows:
        k = key(r)
        s = sums.setdefault(k, {"quantity": ZERO, "amount": ZERO, "credited": ZERO, "net_amount": ZERO})
        for name in s:
            s[name] += r[name]
    out = []
    for k in sorted(sums):
        s = sums[k]
        currency = k[-1]
        out.append({**dict(zip(names, k, strict=True)), **({"quantity": format(s["quantity"], "f")} if quantity else {}),
                    "amount": _money(s["amount"], currency), "credited": _money(s["credited"], currency),
                    "net_amount": _money(s["net_amount"], currency)})
    return out


def _table(id_: str, title: str, columns: list[str], rows: list[dict], note: str = "",
           chart: dict | None = None) -> dict:
    return {"id": id_, "title": title, "columns": columns, "rows": rows, "note": note, "chart": chart}


def _bar(x: str, series: list[tuple[str, str]], y_title: str, kind: str = "bar") -> dict:
    """A bar chart over categories (a period label such as 2026-11 is a category, not a date)."""
    return {"kind": kind, "x": x, "series": series, "y_title": y_title, "x_type": "category"}


# ---------------------------------------------------------------- the views


class Budget(Protocol):
    """A customer's monthly budget as serving.budgets keeps it (the roof passes the lookup)."""

    monthly_cap: Decimal | None
    mode: str


class DashboardViews:
    """Billing's parts of the dashboards (the shape of dashboards.billing_views.BillingViews).
    `cost_model()` is the cost model current-period spend is previewed under, `budget(customer_id)`
    the customer's monthly budget or None; both are looked up at each call."""

    def __init__(self, *, cost_model: Callable[[], CostModel | None], budget: Callable[[str], Budget | None]):
        self._cost_model = cost_model
        self._budget = budget

    # --- the customer's page

    def invoices(self, conn: psycopg.Connection, customer_id: str) -> list[dict]:
        """The customer's invoices, newest period first, each with its lines and credit notes. Drafts are
        not documents yet (the running period is in current-period spend) and are left out."""
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM billing_invoices WHERE customer_id = %s AND status <> 'draft' "
            "ORDER BY period_start DESC, sequence DESC", (customer_id,))]
        return [_customer_invoice(show_invoice(conn, i)) for i in ids]

    def invoice(self, conn: psycopg.Connection, customer_id: str, invoice_id: str) -> dict | None:
        """One of the customer's invoices (not a draft); None for anything else, another customer's included."""
        row = conn.execute("SELECT customer_id, status FROM billing_invoices WHERE id = %s", (invoice_id,)).fetchone()
        if row is None or row[0] != customer_id or row[1] == "draft":
            return None
        return _customer_invoice(show_invoice(conn, invoice_id))

    def current_period_spend(self, conn: psycopg.Connection, customer_id: str, now: datetime,
                             period: str | None = None) -> dict:
        """The billing preview of the customer's period containing `now` (or of `period`), with its prepaid
        credit balance and its monthly budget (when it has one: the share of it the subtotal is):
        `preview_invoice` under the cost model, as `infermeter invoice preview` prints it. `available` is
        False, with a message, for a customer without a billing account or a plan for the period."""
        customer = get_customer(conn, customer_id)
        if customer is None:
            return {"available": False, "customer_id": customer_id, "period": period,
                    "message": "No billing account yet: there is no invoice to preview."}
        if period is not None:
            parse_label(period)
        label = period or period_containing(now, customer.timezone, customer.anchor_day).label
        try:
            preview = preview_invoice(conn, customer_id, label, now=now, cost_model=self._cost_model())
        except BillingServiceError:
            return {"available": False, "customer_id": customer_id, "period": label,
                    "message": f"No price plan covers the period {label}: there is no invoice to preview."}
        credits = credits_view(conn, customer_id, now=now)
        spend = {"available": True, **preview, "credit_balance": credits["balance"],
                 "lines": [{k: line[k] for k in LINE_KEYS} for line in preview["lines"]]}
        budget = self._budget(customer_id)
        if budget is not None and budget.monthly_cap is not None:
            cap = budget.monthly_cap
            spend["budget"] = {"monthly_cap": money_text(cap, spend["currency"]), "mode": budget.mode,
                               "used": None if not cap else round(float(Decimal(spend["subtotal"]) / cap), 6)}
        return spend

    def customer_name(self, conn: psycopg.Connection, customer_id: str) -> str | None:
        """The customer's display name (its billing account's); None without one or without a name."""
        customer = get_customer(conn, customer_id)
        return None if customer is None else customer.name or None

    def customer_price_book(self, conn: psycopg.Connection, customer_id: str, at: datetime) -> PriceBook | None:
        """The book of the customer's plan for the period containing `at`; None without one."""
        customer = get_customer(conn, customer_id)
        if customer is None:
            return None
        plan = plan_at(plans(conn, customer_id), period_containing(at, customer.timezone, customer.anchor_day).start)
        return None if plan is None else load_book(conn, plan.book_sha256).book

    # --- the finance page

    def finance_page(self, conn: psycopg.Connection, period: str | None, now: datetime) -> dict:
        """The finance page of a billing period (default: the latest invoiced one): revenue by customer,
        model, meter and month, invoice statuses, credits outstanding, and the exports.

        Revenue is what charging invoices (final, paid, failed) carry for the service period, less credit
        notes: the revenue export's rows (`exports.revenue_rows`), summed. One snapshot for every read."""
        if period is not None:
            parse_label(period)
        with conn.transaction():  # one snapshot (on a connection not yet in a transaction)
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            periods = invoiced_periods(conn)
            period = period or (periods[-1] if periods else f"{now:%Y-%m}")
            revenue = revenue_rows(conn, period, None)
            invoices = invoice_rows(conn, period, None)
            months = [r for p in periods for r in revenue_rows(conn, p, None)]
            granted = [r[0] for r in conn.execute("SELECT DISTINCT customer_id FROM billing_credit_grants ORDER BY 1")]
            credits = [credits_view(conn, c, now=now) for c in granted]
        currencies = sorted({r["currency"] for r in revenue} | {i["currency"] for i in invoices}) or ["USD"]
        money = "/".join(currencies)
        amounts = ["amount", "credited", "net_amount"]

        statuses: dict[tuple[str, str], dict] = {}
        for cur in currencies:
            for code, label in STATUS_LABELS.items():
                statuses[(code, cur)] = {"status": label, "status_code": code, "currency": cur, "invoices": 0, "total": ZERO}
        for i in invoices:
            s = statuses[(i["status"], i["currency"])]
            s["invoices"] += 1
            s["total"] += i["total"]
        status_rows = [{**s, "total": _money(s["total"], s["currency"])} for s in statuses.values()]

        outstanding = []
        for c in credits:
            granted_total = sum((Decimal(g["amount"]) for g in c["grants"]), ZERO)
            known = [e for e in c["ledger"] if datetime.fromisoformat(e["at"]) <= now]  # as the balance counts
            used = sum((-Decimal(e["amount"]) for e in known if e["kind"] == "use"), ZERO)
            expired = sum((-Decimal(e["amount"]) for e in known if e["kind"] == "expiry"), ZERO)
            outstanding.append({"customer_id": c["customer_id"], "currency": c["currency"],
                                "granted": _money(granted_total, c["currency"]), "used": _money(used, c["currency"]),
                                "expired": _money(expired, c["currency"]), "balance": c["balance"]})
        balances: dict[str, Decimal] = defaultdict(lambda: ZERO)
        for c in outstanding:
            balances[c["currency"]] += Decimal(c["balance"])

        by_customer = _grouped(revenue, lambda r: (r["customer_id"], r["currency"]), ("customer_id", "currency"))
        tables = [
            _table("revenue_month", "Revenue by month", ["period", "currency"] + amounts,
                   _grouped(months, lambda r: (r["period"], r["currency"]), ("period", "currency")),
                   "Each service month's lines on final, paid or failed invoices (adjustments included wherever "
                   "they were invoiced), less credit notes.",
                   _bar("period", [("net revenue", "net_amount")], money)),
            _table("revenue_customer", f"Revenue by customer, {period}", ["customer_id", "currency"] + amounts, by_customer,
                   "Net = invoiced - credited by credit notes; equals the revenue export summed per customer.",
                   _bar("customer_id", [("net revenue", "net_amount")], money)),
            _table("revenue_model", f"Revenue by model, {period}", ["model", "currency"] + amounts,
                   _grouped(revenue, lambda r: (r["model"] or "(not per model)", r["currency"]), ("model", "currency")),
                   "Request meters (tokens, requests) by model; GPU time, tasks and other meters are not per model.",
                   _bar("model", [("net revenue", "net_amount")], money)),
            _table("revenue_meter", f"Revenue by meter, {period}", ["meter", "currency", "quantity"] + amounts,
                   _grouped(revenue, lambda r: (r["meter"], r["currency"]), ("meter", "currency"), quantity=True), "",
                   _bar("meter", [("net revenue", "net_amount")], money)),
            _table("invoice_status", f"Invoices by status, {period}",
                   ["status", "status_code", "currency", "invoices", "total"], status_rows,
                   "final = finalized and awaiting payment (status open); failed = payment failed.",
                   _bar("status", [("invoices", "invoices")], "invoices")),
            _table("credits", "Prepaid credits outstanding", ["customer_id", "currency", "granted", "used", "expired",
                                                              "balance"], outstanding,
                   "Balance usable now (grants less what invoices used and what expired). Total: "
                   + (", ".join(f"{_money(v, k)} {k}" for k, v in sorted(balances.items())) or "none") + "."),
        ]
        exports = [{"kind": k, "format": f, "api": f"/v1/billing/exports/{k}?period={period}&format={f}"}
                   for k in KINDS for f in FORMATS]
        return {"period": period, "periods": periods, "currencies": currencies, "tables": tables, "exports": exports,
                "invoices": len(invoices)}

    def finance_export(self, conn: psycopg.Connection, kind: str, period: str, fmt: str) -> tuple[bytes, str, str]:
        """(bytes, file name, media type) of a finance export: the same bytes as `infermeter export KIND` and
        GET /v1/billing/exports/KIND."""
        from billing_service.exports import MEDIA_TYPES, check_format, check_kind, export, file_name

        check_kind(kind)
        check_format(fmt)
        return export(conn, kind, period, fmt), file_name(kind, period, fmt, None), MEDIA_TYPES[fmt]
