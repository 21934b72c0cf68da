"""`infermeter demo`, the main job, on a fresh home: a month built from the trace, through Kafka and
metering, exact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from app.demo.month import OCCURRENCES
from tests.cli.test_cli import run


def test_demo_replays_the_trace_and_everything_reconciles():
    home = Path(tempfile.mkdtemp(prefix="infermeter-demo-")) / "home"
    result = run(["demo", "--requests", "600"], home, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "match" in result.stdout
    summary = json.loads((home / "demo" / "summary.json").read_text())
    assert summary["reconcile_ok"] is True
    assert summary["emitted"] == summary["metered"]
    assert summary["window"] == ["2026-11-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00"]
    assert summary["emitted"]["requests"] == 600 * OCCURRENCES  # each conversation of the pool recurs
    assert 0 < summary["emitted"]["cached_input_tokens"] < summary["emitted"]["input_tokens"]
    assert summary["counts"]["rejected"] == 0
    assert {book["id"] for book in summary["pricing"]["books"]} >= {"per-token-2026-11"}
    risk = summary["pricing"]["books"][0]["risk"]
    assert risk["bucket"] == "day" and len(risk["buckets"]) == 30
    assert (home / "demo" / "pricing.html").stat().st_size > 10_000
    advice = summary["pricing"]["recommendation"]  # the pricing step ends with the price recommendation
    assert [b["id"] for b in advice["books"]] == [b["id"] for b in summary["pricing"]["books"]]
    for book in advice["books"]:
        assert book["before"]["margin"] == next(b["margin"] for b in summary["pricing"]["books"] if b["id"] == book["id"])
        assert float(book["after"]["margin_pct"]) >= 25 and float(book["after"]["loss_probability"]) <= 0.05
    assert (home / "demo" / "recommend.html").stat().st_size > 10_000
    billing = summary["billing"]
    assert billing["period"] == "2026-11" and billing["reconcile_ok"] is True and billing["unbilled"] == []
    assert billing["invoices"] == billing["finalized"] > 0 and 0 < float(billing["credits_applied"]) <= 10
    assert (home / "demo" / "revenue-2026-11.parquet").stat().st_size > 0
    invoiced = billing["total"]

    # A second run on the same home meters nothing twice.
    again = run(["demo", "--requests", "600"], home, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((home / "demo" / "summary.json").read_text())
    assert summary["counts"]["accepted"] == 0 and summary["emitted"] == summary["metered"]
    assert summary["billing"]["total"] == invoiced and summary["billing"]["reconcile_ok"] is True
