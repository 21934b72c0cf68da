"""The shipped Grafana dashboards parse, and every PromQL expression in them names only metrics the
code exports (serving.metrics' registry for the gateway, dashboards.metering_metrics for metering)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dashboards import metering_metrics
from serving import metrics as serving_metrics

GRAFANA = Path(__file__).resolve().parents[2] / "dashboards" / "grafana"
PROMQL_WORDS = {
    "sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "max", "min", "avg", "count", "time",
    "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "topk", "bottomk",
    "le", "quantile", "instance", "job", "spool", "status", "reason", "kind", "model", "topic", "partition", "group",
}


def exported_names() -> set[str]:
    """Every series name the registries can expose (counters as _total, histograms' _bucket/_sum/_count)."""
    families = list(serving_metrics.REGISTRY.collect()) + list(metering_metrics.MeteringCollector(None).describe())
    names = set()
    for family in families:
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count", f"{family.name}_created"}
        else:
            names.add(family.name)
    return names


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping label lists
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {w for w in words if w not in PROMQL_WORDS}


@pytest.mark.parametrize("name", ["gateway", "metering"])
def test_every_expression_names_exported_metrics(name):
    dashboard = json.loads((GRAFANA / f"{name}.json").read_text())
    assert dashboard["uid"] and dashboard["panels"]
    exprs = expressions(dashboard)
    assert exprs
    exported = exported_names()
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, f"{expr}: {names - exported} not exported"
        used |= names
    prefix = {"gateway": ("infermeter_gateway_", "infermeter_emitter_"), "metering": ("infermeter_metering_",)}[name]
    assert all(n.startswith(prefix) for n in used), used


def test_the_dashboards_cover_what_operators_watch():
    gateway = " ".join(expressions(json.loads((GRAFANA / "gateway.json").read_text())))
    metering = " ".join(expressions(json.loads((GRAFANA / "metering.json").read_text())))
    for needed in ("infermeter_gateway_requests_total", "infermeter_gateway_request_duration_seconds_bucket",
                   "infermeter_emitter_spool_depth", "infermeter_emitter_publish_lag_seconds",
                   "infermeter_gateway_rejections_total"):
        assert needed in gateway
    for needed in ("infermeter_metering_consumed_messages_total", "infermeter_metering_dead_letters_total"):
        assert needed in metering


def test_the_checker_catches_an_unknown_metric():
    assert metric_names("sum by (status) (rate(infermeter_gateway_requestz_total{model='x'}[5m]))") == {
        "infermeter_gateway_requestz_total"}
