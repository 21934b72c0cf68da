"""Spool depth and publish lag per gateway, read from each gateway's Prometheus /metrics
(INFERMETER_GATEWAY_METRICS_URLS; the names are serving.metrics', parsed here, not imported)."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

WANTED = {
    "infermeter_emitter_spool_depth": "spool_depth",
    "infermeter_emitter_publish_lag_seconds": "publish_lag_seconds",
    "infermeter_gateway_requests_total": "requests_total",
    "infermeter_gateway_rejections_total": "rejections_total",
    "infermeter_emitter_publish_failures_total": "publish_failures_total",
}


def configured_urls(setting: str) -> list[str]:
    return [u.strip() for u in (setting or "").split(",") if u.strip()]


def parse(text: str) -> dict[str, Any]:
    """Per spool: depth and lag; totals of requests, rejections and publish failures."""
    spools: dict[str, dict[str, float]] = {}
    totals = {"requests_total": 0.0, "rejections_total": 0.0, "publish_failures_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = WANTED.get(sample.name)
            if key in ("spool_depth", "publish_lag_seconds"):
                spools.setdefault(sample.labels.get("spool", ""), {})[key] = sample.value
            elif key is not None:
                totals[key] += sample.value
    return {"spools": [{"spool": s, **v} for s, v in sorted(spools.items())], **totals}


def scrape(urls: list[str], timeout_s: float = 2.0) -> list[dict[str, Any]]:
    out = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - operator-configured URL
                out.append({"url": url, "ok": True, **parse(response.read().decode("utf-8", "replace"))})
        except (OSError, ValueError) as exc:
            out.append({"url": url, "ok": False, "error": str(exc) or type(exc).__name__, "spools": []})
    return out
