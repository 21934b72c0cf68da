"""The pricing comparison's report: `ComparisonReport`, what `pricing_service.compare.run_comparison`
returns, as JSON (`to_json`), CSV (`write_csv`) and terminal tables (`render_console`). Its HTML
page is `pricing_service.report_html`. `gross_margin_pct` is the margin percentage they all show."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from infermeter.times import utc_now, utc_text
from pricing.experiments import Comparison


def _s(d: Decimal | None) -> str | None:
    return None if d is None else str(d)


@dataclass
class ComparisonReport:
    comparison: Comparison
    sources: list[str]
    cost_model_source: str
    generated_at: datetime = field(default_factory=utc_now)

    @property
    def books(self):
        return self.comparison.books

    def to_json(self) -> dict[str, Any]:
        """{"books": [{"id", "currency", "revenue", "cost", "margin", "customers": [{"customer_id",
        "revenue", "cost", ...}], ...}], ...}: amounts as decimal strings."""
        c = self.comparison
        books = []
        for source, b in zip(self.sources, c.books, strict=True):
            books.append(
                {
                    "id": b.book.id,
                    "currency": b.book.currency,
                    "revenue": str(b.revenue),
                    "cost": str(b.cost),
                    "margin": str(b.margin),
                    "customers": [
                        {
                            "customer_id": cr.customer_id,
                            "revenue": str(cr.revenue),
                            "cost": str(cr.cost),
                            "margin": str(cr.margin),
                            "versus_baseline": str(cr.versus_baseline),
                        }
                        for cr in b.customers
                    ],
                    "source": source,
                    "gross_margin_pct": _s(gross_margin_pct(b.margin, b.revenue)),
                    "customers_paying_more_than_baseline": len(b.pays_more),
                    "customers_paying_less_than_baseline": len(b.pays_less),
                    "risk": {
                        "bucket": b.risk.bucket,
                        "margin_stdev": str(b.risk.margin_stdev),
                        "margin_min": _s(min(b.risk.margins, default=None)),
                        "margin_max": _s(max(b.risk.margins, default=None)),
                        "customer_margin_stdev": str(b.risk.customer_margin_stdev),
                        "loss_making_customers": b.risk.loss_making_customers,
                        "buckets": [
                            {"start": utc_text(x.start), "revenue": str(x.revenue), "cost": str(x.cost), "margin": str(x.margin)}
                            for x in b.risk.buckets
                        ],
                    },
                    "caching": [
                        {
                            "model": g.model,
                            "cached_input_tokens": g.cached_input_tokens,
                            "cost_gain": str(g.cost_gain),
                            "passed_to_customers": str(g.passed_to_customers),
                            "kept_by_platform": str(g.kept_by_platform),
                            "cost_without_caching": str(g.cost_without_caching),
                            "revenue_without_caching": str(g.revenue_without_caching),
                        }
                        for g in b.caching
                    ],
                    "retries": None
                    if b.retries is None
                    else {
                        "retried_attempts": b.retries.retried_attempts,
                        "retried_cost": str(b.retries.retried_cost),
                        "revenue_from_retries": str(b.retries.revenue_from_retries),
                        "absorbed_by_platform": str(b.retries.absorbed_by_platform),
                        "paid_by": b.retries.paid_by,
                    },
                    "anatomy": [
                        {"term": e.term, "cost": str(e.cost), "billed_to_customers": str(e.billed_to_customers),
                         "carried_by_platform": str(e.carried_by_platform)}
                        for e in b.anatomy
                    ],
                }
            )
        return {
            "books": books,
            "window": {"from": utc_text(c.start), "to": utc_text(c.end)},
            "currency": c.currency,
            "usage": {k: format(v, "f") for k, v in c.usage_totals.items()},
            "cost_summary": {
                "total": str(c.cost_total_precise),
                "idle_shared_pool": str(c.idle_pool_cost),
                "by_model": {m: str(v) for m, v in c.cost_by_model.items()},
                "successful_tasks": c.successful_tasks,
                "cost_per_successful_task": _s(c.cost_per_successful_task),
                "anatomy": None if c.anatomy is None else c.anatomy.to_json(),
            },
            "cost_model": self.cost_model_source,
            "generated_at": utc_text(self.generated_at),
        }

    def write_csv(self, path: Path) -> None:
        """One row per book x customer (plus a TOTAL row per book)."""
        with Path(path).open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["book_id", "currency", "customer_id", "revenue", "cost", "margin", "versus_baseline"])
            for b in self.books:
                for cr in b.customers:
                    w.writerow([b.book.id, b.book.currency, cr.customer_id, cr.revenue, cr.cost, cr.margin, cr.versus_baseline])
                w.writerow([b.book.id, b.book.currency, "TOTAL", b.revenue, b.cost, b.margin, ""])


def gross_margin_pct(margin: Decimal, revenue: Decimal) -> Decimal | None:
    """`margin` as a percentage of `revenue`, to 0.1 (None without revenue)."""
    if not revenue:
        return None
    return (margin * 100 / revenue).quantize(Decimal("0.1"))


def render_console(report: ComparisonReport, console: Console) -> None:
    """The comparison as terminal tables, each readable in 80 columns: figures that do not depend on
    the book (cached tokens, what caching and retries cost) are printed once, not per book."""
    c = report.comparison
    cur = c.currency
    baseline = c.books[0]
    console.print(
        f"[bold]Pricing comparison[/bold] {utc_text(c.start)} .. {utc_text(c.end)} ({cur}); "
        f"baseline: [bold]{baseline.book.id}[/bold]"
    )
    if not baseline.customers:
        console.print(
            "[yellow]No metered usage in this window[/yellow] (request, task, usage or GPU rollups): "
            "check --from/--to against `infermeter usage`."
        )
    t = Table(title="Revenue, cost and gross margin per book")
    for col in ("book", "revenue", "cost", "margin", "margin %"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
    for b in c.books:
        pct = gross_margin_pct(b.margin, b.revenue)
        t.add_row(b.book.id, str(b.revenue), str(b.cost), str(b.margin), "-" if pct is None else f"{pct}%")
    console.print(t)

    per = {"day": "daily", "hour": "hourly"}.get(baseline.risk.bucket, f"per {baseline.risk.bucket}")
    t = Table(title="Customers versus the baseline, and margin risk")
    for col in ("book", "pay more", "pay less", f"{per} margin sd", "loss-making customers"):
        t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
    for b in c.books:
        t.add_row(b.book.id, str(len(b.pays_more)), str(len(b.pays_less)),
                  str(b.risk.margin_stdev.quantize(Decimal("0.01"))), str(b.risk.loss_making_customers))
    console.print(t)

    t = Table(title="Top customers by baseline revenue: revenue under each book (change versus the baseline)")
    t.add_column("customer", no_wrap=True)
    for b in c.books:
        t.add_column(b.book.name or b.book.id, justify="right")
    t.add_column("cost", justify="right")
    for cr in sorted(baseline.customers, key=lambda x: x.revenue, reverse=True)[:10]:
        row = [cr.customer_id]
        for b in c.books:
            other = next(x for x in b.customers if x.customer_id == cr.customer_id)
            delta = other.versus_baseline
            row.append(f"{other.revenue}" + ("" if b is baseline else f"\n({'+' if delta >= 0 else ''}{delta})"))
        row.append(str(cr.cost))
        t.add_row(*row)
    console.print(t)
    console.print("columns: " + "; ".join(f"{b.book.name or b.book.id} = {b.book.id}" for b in c.books))

    t = Table(title="Prefix caching: the cost it saved per model")
    for col in ("model", "cached tokens", "cost saved"):
        t.add_column(col, justify="left" if col == "model" else "right", no_wrap=col == "model")
    for g in baseline.caching:
        t.add_row(g.model, f"{g.cached_input_tokens:,}", str(g.cost_gain))
    console.print(t)
    t = Table(title="Prefix caching: who gets the gain")
    for col in ("book", "model", "passed to customers", "kept by platform"):
        t.add_column(col, justify="left" if col in ("book", "model") else "right", no_wrap=col in ("book", "model"))
    for b in c.books:
        for g in b.caching:
            t.add_row(b.book.id, g.model, str(g.passed_to_customers), str(g.kept_by_platform))
    console.print(t)

    r0 = baseline.retries
    if r0 is not None:
        console.print(f"Retried task attempts: {r0.retried_attempts} costing {r0.retried_cost} {cur}.")
    t = Table(title="Retried task attempts: who pays")
    for col in ("book", "revenue from retries", "absorbed by platform", "paid by"):
        t.add_column(col, justify="left" if col in ("book", "paid by") else "right", no_wrap=col == "book")
    for b in c.books:
        r = b.retries
        t.add_row(b.book.id, *(["-", "-", "-"] if r is None else
                               [str(r.revenue_from_retries), str(r.absorbed_by_platform), r.paid_by]))
    console.print(t)
    if c.anatomy is not None:
        terms = ("new_compute", "context_not_reused", "cache_occupancy", "queue_and_idle", "failure")
        t = Table(title="Cost anatomy: the GPU cost's five parts (the same under every book)")
        for col in ("part", "cost"):
            t.add_column(col, justify="left" if col == "part" else "right")
        for x in terms:
            t.add_row(x.replace("_", " "), str(c.anatomy.term(x)))
        console.print(t)
        t = Table(title="Idle loss and failure cost: billed to customers or carried by the platform")
        for col in ("book", "margin", "idle billed", "idle carried", "failure billed", "failure carried"):
            t.add_column(col, justify="left" if col == "book" else "right", no_wrap=col == "book")
        for b in c.books:
            e = {x.term: x for x in b.anatomy}
            t.add_row(b.book.id, str(b.margin),
                      *[str(v) for x in ("queue_and_idle", "failure")
                        for v in (e[x].billed_to_customers, e[x].carried_by_platform)])
        console.print(t)
    cpt = c.cost_per_successful_task
    console.print(
        f"Cost {c.cost_total_precise.quantize(Decimal('0.01'))} {cur} (idle shared pool {c.idle_pool_cost}); "
        f"{c.successful_tasks} successful tasks, cost per successful task "
        f"{'-' if cpt is None else cpt.quantize(Decimal('0.0001'))} {cur}."
    )
