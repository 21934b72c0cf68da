"""The price recommendation's HTML page: one self-contained page (plotly.js inlined, works offline), in
the style of the pricing-experiment report (`pricing_service.report_html`).

No chart control sends data off the machine: every chart gets PLOTLY_CONFIG (no plotly logo link, no
"Share chart..." / "send to cloud", no "edit in Chart Studio", no link to plot.ly), so its mode bar
keeps only local buttons (zoom, pan, select, reset, download as PNG). Charts convert amounts to floats
for drawing only; every number in the tables is the exact decimal string.
"""

from __future__ import annotations

import html
import warnings
from decimal import Decimal
from pathlib import Path

import plotly.graph_objects as go

from infermeter.times import utc_text
from pricing.recommend import Recommendation, percent
from pricing_service.recommend import RecommendationReport, change_pct
from pricing_service.report_html import CSS, _table

# The plotly.js plotly ships (4.x) shows "Share chart...", a button that sends the chart to Chart Studio,
# unless showSendToCloud is false, and a logo linking to plotly.com unless displaylogo is false;
# showLink and showEditInChartStudio are options of older plotly.js (plotly.py warns it does not know
# them), kept so that those links stay off there too. The buttons' names are removed as well.
PLOTLY_CONFIG = {
    "displaylogo": False,
    "showSendToCloud": False,
    "showEditInChartStudio": False,
    "showLink": False,
    "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud", "editInChartStudio"],
    "responsive": True,
}


def _f(d: Decimal) -> float:
    return float(d)


def _figures(r: Recommendation, currency: str) -> list[tuple[str, str, str, go.Figure]]:
    before, after = r.before, r.after
    label_before, label_after = "prices as they are", f"prices x {r.scale}"
    figs = []

    fig = go.Figure([
        go.Histogram(name=label_before, x=[_f(m) for m in before.period_margins], opacity=0.6),
        go.Histogram(name=label_after, x=[_f(m) for m in after.period_margins], opacity=0.6),
    ])
    fig.add_vline(x=0, line_dash="dash", line_color="black")
    fig.update_layout(barmode="overlay", xaxis_title=f"margin per {r.period_days}-day billing period ({currency})",
                      yaxis_title="bootstrapped periods")
    figs.append(("distribution", "Margin per billing period, before and after",
                 f"{r.draws} billing periods of {r.period_days} days, each made of days drawn from the window "
                 "(weekdays from weekdays, weekend days from weekend days, after resampling the days themselves); "
                 "each customer's period is rated under the book, the drawn days' cost subtracted. Left of the dashed "
                 "line: loss-making periods.", fig))

    n = len(before.period_margins)
    share = [100 * (i + 1) / n for i in range(n)]
    fig = go.Figure([
        go.Scatter(name=label_before, x=share, y=[_f(m) for m in sorted(before.period_margins)], mode="lines"),
        go.Scatter(name=label_after, x=share, y=[_f(m) for m in sorted(after.period_margins)], mode="lines"),
    ])
    fig.add_hline(y=0, line_dash="dash", line_color="black")
    fig.add_vline(x=_f(r.risk * 100), line_dash="dot", line_color="firebrick",
                  annotation_text=f"risk {percent(r.risk)}")
    fig.update_layout(xaxis_title="share of periods with at most this margin (%)",
                      yaxis_title=f"margin ({currency})")
    figs.append(("quantiles", "Period margins in order: where the risk line crosses zero",
                 "Each curve is the periods' margins sorted. The book meets the risk when its curve is above zero "
                 "at the risk line: at most that share of periods lose money.", fig))

    fig = go.Figure([
        go.Bar(name="revenue", x=[label_before, label_after], y=[_f(before.revenue), _f(after.revenue)]),
        go.Bar(name="cost", x=[label_before, label_after], y=[_f(before.cost), _f(after.cost)]),
        go.Bar(name="margin", x=[label_before, label_after], y=[_f(before.margin), _f(after.margin)]),
    ])
    fig.update_layout(barmode="group", yaxis_title=currency)
    figs.append(("window", "The window itself: revenue, cost and margin",
                 f"The window rated as one period, as `pricing compare` rates it. The target: a margin of at least "
                 f"{percent(r.target)} of revenue.", fig))
    return figs


def write_html(report: RecommendationReport, path: Path) -> Path:
    first = report.recommendations[0]
    cur = report.currency
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Price recommendation {html.escape(utc_text(report.start))} .. {html.escape(utc_text(report.end))}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Price recommendation: how far to scale each book's prices</h1>",
        f"<p class='note'>Window [{utc_text(report.start)}, {utc_text(report.end)}), currency {cur}, cost model "
        f"{html.escape(report.cost_model_source)}. Conditions: over the window the margin is at least "
        f"{percent(first.target)} of revenue, and at most {percent(first.risk)} of {first.draws} bootstrapped "
        f"{first.period_days}-day billing periods lose money (seed {first.seed}). The scale is the smallest, to "
        "0.0001, that meets both; each price is rounded up to its book's precision.</p>",
    ]
    rows = []
    for r in report.recommendations:
        rows.append([r.book.id, r.scale, f"{change_pct(r.scale)}%", r.before.margin, percent(r.before.margin_share),
                     r.after.margin, percent(r.after.margin_share), percent(r.before.loss_probability),
                     percent(r.after.loss_probability), r.binding])
    parts.append(_table(["book", "scale", "change", "margin before", "margin % before", "margin after",
                         "margin % after", "P(loss) before", "P(loss) after", "set by"], rows))
    chart = 0
    for index, r in enumerate(report.recommendations):
        parts.append(f"<h2>{html.escape(r.book.id)}: x {r.scale}</h2>")
        q0, q1 = r.before.quantiles(r.book.money), r.after.quantiles(r.book.money)
        keys = ("min", "p5", "p10", "p50", "p90", "p95", "max", "mean")
        parts.append(_table(["period margin", *keys], [["before", *[q0[k] for k in keys]],
                                                       ["after", *[q1[k] for k in keys]]]))
        parts.append(_table(["price", "charge", "before", "after"],
                            [[c.where, c.charge, c.before, c.after] for c in r.changes]))
        for key, title, note, fig in _figures(r, cur):
            fig.update_layout(title=title, template="plotly_white", height=420, margin={"t": 60})
            parts.append(f"<h3>{html.escape(title)}</h3><p class='note'>{html.escape(note)}</p>")
            with warnings.catch_warnings():  # plotly.py does not know showLink / showEditInChartStudio
                warnings.filterwarnings("ignore", message=r"\s*Unrecognized config options")
                parts.append(fig.to_html(full_html=False, include_plotlyjs=(chart == 0),
                                         div_id=f"chart-{index}-{key}", config=PLOTLY_CONFIG))
            chart += 1
    parts.append("</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
