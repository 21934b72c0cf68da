"""`infermeter demo`, the main job, on a fresh home: the trace through Kafka and metering, exact."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.cli.test_cli import run


def test_demo_replays_the_trace_and_everything_reconciles():
    home = Path(tempfile.mkdtemp(prefix="infermeter-demo-")) / "home"
    result = run(["demo", "--requests", "600"], home, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "match" in result.stdout
    summary = json.loads((home / "demo" / "summary.json").read_text())
    assert summary["reconcile_ok"] is True
    assert summary["emitted"] == summary["metered"]
    assert summary["emitted"]["requests"] == 600
    assert 0 < summary["emitted"]["cached_input_tokens"] < summary["emitted"]["input_tokens"]
    assert summary["counts"]["rejected"] == 0
    assert {book["id"] for book in summary["pricing"]["books"]} >= {"per-token-2026-11"}
    assert (home / "demo" / "pricing.html").stat().st_size > 10_000

    # A second run on the same home meters nothing twice.
    again = run(["demo", "--requests", "600"], home, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((home / "demo" / "summary.json").read_text())
    assert summary["counts"]["accepted"] == 0 and summary["emitted"] == summary["metered"]
