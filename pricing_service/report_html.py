"""The HTML pricing-experiment report: one self-contained page (plotly.js inlined, works offline).

Charts convert amounts to floats for drawing only; every number shown in the tables is the exact
decimal string.
"""

from __future__ import annotations

import html
from decimal import Decimal
from pathlib import Path

import plotly.graph_objects as go

from infermeter.times import utc_text
from pricing.anatomy import TERMS
from pricing_service.books import EXAMPLE_COST_MODEL, REPO_ROOT
from pricing_service.comparison_report import ComparisonReport, gross_margin_pct

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;line-height:1.45}
h1{font-size:1.6rem} h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.8rem 0;font-size:.9rem} td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left} .note{color:#555;font-size:.92rem} .chart{min-height:420px}
"""


def _f(d: Decimal) -> float:
    return float(d)


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figures(report: ComparisonReport) -> list[tuple[str, str, go.Figure]]:
    c = report.comparison
    ids = [b.book.id for b in c.books]
    figs = []

    fig = go.Figure(
        [
            go.Bar(name="revenue", x=ids, y=[_f(b.revenue) for b in c.books]),
            go.Bar(name="cost", x=ids, y=[_f(b.cost) for b in c.books]),
            go.Bar(name="gross margin", x=ids, y=[_f(b.margin) for b in c.books]),
        ]
    )
    fig.update_layout(barmode="group", yaxis_title=c.currency)
    figs.append(("overview", "Revenue, cost and gross margin per price book", fig))

    top = [x.customer_id for x in sorted(c.books[0].customers, key=lambda x: x.revenue, reverse=True)[:25]]
    fig = go.Figure(
        [
            go.Bar(name=b.book.id, x=top, y=[_f(next(x.revenue for x in b.customers if x.customer_id == cid)) for cid in top])
            for b in c.books
        ]
        + [go.Scatter(name="cost to serve", x=top, mode="markers",
                      y=[_f(next(x.cost for x in c.books[0].customers if x.customer_id == cid)) for cid in top],
                      marker={"symbol": "diamond", "size": 9, "color": "black"})]
    )
    fig.update_layout(barmode="group", yaxis_title=c.currency, xaxis_title="customer (top 25 by baseline revenue)")
    figs.append(("customers", "Revenue per customer under each book, beside the cost of serving them", fig))

    bucket = c.books[0].risk.bucket
    fig = go.Figure(
        [
            go.Scatter(name=b.book.id, x=[utc_text(x.start) for x in b.risk.buckets], y=[_f(x.margin) for x in b.risk.buckets],
                       mode="lines+markers")
            for b in c.books
        ]
    )
    fig.update_layout(yaxis_title=f"margin per {bucket} ({c.currency})", xaxis_title=bucket)
    figs.append(("risk", f"Risk: gross margin per {bucket} under each book", fig))

    labels = [f"{b.book.id} / {g.model}" for b in c.books for g in b.caching]
    fig = go.Figure(
        [
            go.Bar(name="passed to customers", x=labels, y=[_f(g.passed_to_customers) for b in c.books for g in b.caching]),
            go.Bar(name="kept by the platform", x=labels, y=[_f(g.kept_by_platform) for b in c.books for g in b.caching]),
        ]
    )
    fig.update_layout(barmode="relative", yaxis_title=c.currency)
    figs.append(("caching", "Prefix caching gain per model: who keeps it", fig))

    fig = go.Figure(
        [
            go.Bar(name="cost of retried attempts", x=ids, y=[_f(b.retries.retried_cost) for b in c.books]),
            go.Bar(name="revenue from retried attempts", x=ids, y=[_f(b.retries.revenue_from_retries) for b in c.books]),
        ]
    )
    fig.update_layout(barmode="group", yaxis_title=c.currency)
    figs.append(("retries", "Retried task attempts: cost, and revenue they bring", fig))
    return figs


NOTES = {
    "overview": "Revenue is what customers would have been invoiced under each book for this window (sum of "
    "lines rounded once each); cost is the GPU time of every deployment at the configured $/GPU-hour plus "
    "tool and verification usage at configured unit costs (the same under every book); margin = revenue - cost.",
    "customers": "Each bar is one customer's invoice total under a book; the diamond is what serving that customer "
    "cost (its share of GPU time by weighted tokens, plus its dedicated deployments). The first book is the baseline.",
    "risk": "How steady the margin is over time: the window is cut into days (hours for windows under two days) and "
    "each slice is rated progressively, so the slices add up to the whole window's invoice. A wide spread means the "
    "platform carries utilisation risk.",
    "caching": "The same usage re-costed as if prefix caching were off: cached input tokens become uncached, so "
    "prefill takes more GPU time (at the same GPU-seconds per weighted token). The cost it saved splits into what "
    "customers paid less (passed to customers) and what the platform kept as margin. A negative 'kept' means the "
    "book passes on more than the saving (GPU-hour pricing sells the GPU time caching saved).",
    "retries": "Attempts other than the last of each task. Their cost uses the customer's cost per weighted token; "
    "the revenue they bring is the book's revenue minus its revenue on the same usage without them.",
}


ANATOMY_NOTE = (
    "The cost (the same under every book) divided into new compute, context not reused, cache occupancy, queue "
    "and idle, and failure (docs/cost-model.md, cost anatomy). For idle loss and failure cost, 'billed' is how much "
    "less the book would invoice if that GPU time and those tokens went away, 'carried' is what is left: the margin "
    "the platform gains when the term shrinks. A per-GPU-hour book passes idle loss inside customers' shares to the "
    "customer; a per-task book carries failure cost (failed attempts are not successful tasks); per token, the "
    "customer pays for failed tokens but the platform carries idle loss."
)


def write_html(report: ComparisonReport, path: Path) -> Path:
    c = report.comparison
    # the cost model as the user gave it; the example one by its place in the project, not this machine's path
    cost_model = report.cost_model_source
    cost_model = str(EXAMPLE_COST_MODEL.relative_to(REPO_ROOT)) if cost_model == str(EXAMPLE_COST_MODEL) else cost_model
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Pricing experiment {html.escape(utc_text(c.start))} .. {html.escape(utc_text(c.end))}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Pricing experiment: the same usage under several price books</h1>",
        f"<p class='note'>Window [{utc_text(c.start)}, {utc_text(c.end)}), currency {c.currency}. Baseline book: "
        f"<b>{html.escape(c.books[0].book.id)}</b>. Cost model: {html.escape(cost_model)}. "
        "Per GPU-hour pricing makes the customer carry utilisation; per-token pricing makes the platform carry "
        "production efficiency; per-task pricing makes the platform carry model quality and retries too.</p>",
    ]
    rows = []
    for b in c.books:
        pct = gross_margin_pct(b.margin, b.revenue)
        rows.append([b.book.id, b.revenue, b.cost, b.margin, "-" if pct is None else f"{pct}%", len(b.pays_more),
                     len(b.pays_less), b.risk.margin_stdev.quantize(Decimal("0.01")), b.risk.loss_making_customers])
    parts.append(_table(["book", "revenue", "cost", "margin", "margin %", "customers paying more than baseline",
                         "paying less", f"margin sd per {c.books[0].risk.bucket}", "loss-making customers"], rows))
    cpt = c.cost_per_successful_task
    parts.append(
        "<p class='note'>Usage in the window: " + ", ".join(f"{k} {v:f}" for k, v in c.usage_totals.items())
        + f". Cost per successful task: {'-' if cpt is None else cpt.quantize(Decimal('0.0001'))} {c.currency} "
        f"({c.successful_tasks} successful tasks). Idle shared-pool cost: {c.idle_pool_cost} {c.currency}.</p>"
    )
    for i, (key, title, fig) in enumerate(_figures(report)):
        fig.update_layout(title=title, template="plotly_white", height=440, margin={"t": 60})
        parts.append(f"<h2>{html.escape(title)}</h2><p class='note'>{html.escape(NOTES[key])}</p>")
        parts.append(
            fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"chart-{key}",
                        config={"displaylogo": False, "responsive": True, "showSendToCloud": False,
                                "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud", "editInChartStudio"]})
        )
    parts.append("<h2>Caching and retries in numbers</h2>")
    parts.append(_table(["book", "model", "cached tokens", "cost saved", "passed to customers", "kept by platform"],
                        [[b.book.id, g.model, f"{g.cached_input_tokens:,}", g.cost_gain, g.passed_to_customers,
                          g.kept_by_platform] for b in c.books for g in b.caching]))
    parts.append(_table(["book", "retried attempts", "cost", "revenue from retries", "absorbed by platform", "paid by"],
                        [[b.book.id, b.retries.retried_attempts, b.retries.retried_cost, b.retries.revenue_from_retries,
                          b.retries.absorbed_by_platform, b.retries.paid_by] for b in c.books]))
    if c.anatomy is not None:
        parts.append("<h2>Cost anatomy per book's margin</h2>")
        parts.append(f"<p class='note'>{html.escape(ANATOMY_NOTE)}</p>")
        rows = []
        for b in c.books:
            e = {x.term: x for x in b.anatomy}
            rows.append([b.book.id, b.revenue, *[c.anatomy.term(t) for t in TERMS], b.margin,
                         e["queue_and_idle"].billed_to_customers, e["queue_and_idle"].carried_by_platform,
                         e["failure"].billed_to_customers, e["failure"].carried_by_platform])
        parts.append(_table(["book", "revenue", "new compute", "context not reused", "cache occupancy",
                             "queue and idle", "failure", "margin", "idle loss billed to customers",
                             "idle loss carried by platform", "failure billed to customers",
                             "failure carried by platform"], rows))
        caching = {b.book.id: sum((g.kept_by_platform for g in b.caching), Decimal(0)) for b in c.books}
        parts.append("<p class='note'>Prefix-caching gain kept by the platform: "
                     + ", ".join(f"{html.escape(k)} {v}" for k, v in caching.items()) + f" {c.currency}.</p>")
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
