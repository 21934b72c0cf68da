"""compare on synthetic rollups in the real Postgres: JSON shape, reconciliation with `infermeter usage`,
CSV, clear CLI errors."""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from infermeter.settings import get_settings
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import TimeInputError
from metering import queries
from pricing_service.cli import app
from pricing_service.compare import run_comparison
from pricing_service.source import connect, load_dataset
from tests.pricing_service.conftest import H0, H1, H2

TEST_BOOKS = Path(__file__).parent / "books"
BOOKS = [TEST_BOOKS / n for n in ("per-token.yaml", "gpu-hour.yaml", "per-task.yaml")]
COST_MODEL = TEST_BOOKS / "cost-model.yaml"


def test_dataset_reads_the_window_only(synthetic_db):
    with connect(synthetic_db) as conn:
        ds = load_dataset(conn, H0, H2)
        one = load_dataset(conn, H0, H2, customer_id="cust-3")
    assert len(ds.requests) == 7
    assert sum(g.gpu_ms for g in ds.gpu) == 3_600_000 * 5 + 1_800_000  # the H2 row is outside
    assert sorted(t.task_id for t in ds.tasks) == ["t1", "t2", "t3", "t4"]  # t5 finished after the window
    t3 = next(t for t in ds.tasks if t.task_id == "t3")
    assert [a.attempt for a in t3.attempts] == [1, 2, 3]
    assert next(t for t in ds.tasks if t.task_id == "t1").usage == {"tool_calls": Decimal(30)}
    # one customer's view: its rows plus everyone served in the same deployment-hours
    assert {r.customer_id for r in one.requests} == {"cust-1", "cust-3", "cust-4"}
    assert {(g.deployment_id, g.hour) for g in one.gpu} == {("dep-pool", H1)}
    assert [t.task_id for t in one.tasks] == ["t4"]


def test_window_must_be_whole_hours(synthetic_db):
    with connect(synthetic_db) as conn, pytest.raises(TimeInputError, match="is not a whole hour"):
        load_dataset(conn, H0.replace(minute=30), H2)


def test_comparison_json_shape_and_reconciliation(synthetic_db, tmp_path):
    report = run_comparison(synthetic_db, H0, H2, BOOKS, COST_MODEL)
    data = report.to_json()
    assert [b["id"] for b in data["books"]] == ["per-token-2026-11", "gpu-hour-2026-11", "per-task-2026-11"]
    for book in data["books"]:
        assert {"id", "currency", "revenue", "cost", "margin", "customers"} <= set(book)
        assert book["currency"] == "USD"
        for key in ("revenue", "cost", "margin"):
            assert isinstance(book[key], str)
            Decimal(book[key])
        assert Decimal(book["margin"]) == Decimal(book["revenue"]) - Decimal(book["cost"])
        assert [c["customer_id"] for c in book["customers"]] == ["cust-1", "cust-2", "cust-3", "cust-4"]
        for c in book["customers"]:
            assert {"customer_id", "revenue", "cost"} <= set(c)
            assert isinstance(c["revenue"], str) and isinstance(c["cost"], str)
        assert Decimal(book["revenue"]) == sum(Decimal(c["revenue"]) for c in book["customers"])
    json.dumps(data)  # serialisable as is

    # quantities reconcile with `infermeter usage` (metering.queries.usage) for the same window
    with psycopg.connect(to_libpq_url(synthetic_db)) as conn:
        rows = queries.usage(conn, queries.Window(H0, H2))
    for field in ("requests", "cached_input_tokens", "uncached_input_tokens", "output_tokens"):
        assert Decimal(data["usage"][field]) == sum(r[field] for r in rows), field
    # GPU time: every GPU-second in the window is either billed to a customer or idle in the pool
    assert Decimal(data["usage"]["gpu_seconds"]) == Decimal(3600 * 5 + 1800)
    assert data["usage"]["successful_tasks"] == "3"
    assert data["usage"]["task_attempts"] == "7"

    # cost: 5.5 H100-hours at 2.50 = 13.75, plus tool calls 280 x 0.0005 = 0.14
    assert Decimal(data["cost_summary"]["total"]) == Decimal("13.89")
    per_token, gpu_hour, per_task = data["books"]
    # GPU-hour: all 5.5 GPU-hours are billed (no idle pool hour here) at 4.00 -> 22.00
    assert Decimal(gpu_hour["revenue"]) == Decimal("22.00")
    # per task: 3 successful tasks x 0.05 + (250 - 100 free) tool calls x 0.001 -> 0.15 + 0.15
    assert Decimal(per_task["revenue"]) == Decimal("0.30")
    assert per_task["retries"]["paid_by"] == "platform"
    assert per_token["retries"]["paid_by"] in ("customers", "shared")
    assert {g["model"] for g in per_token["caching"]} == {"kimi-chat", "kimi-chat-lite"}
    assert per_token["risk"]["bucket"] == "hour" and len(per_token["risk"]["buckets"]) == 2
    # the hourly slices add up to the whole window's revenue
    for book in data["books"]:
        assert sum(Decimal(b["revenue"]) for b in book["risk"]["buckets"]) == Decimal(book["revenue"])

    out = tmp_path / "report.csv"
    report.write_csv(out)
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 3 * 5
    assert rows[4] == {"book_id": "per-token-2026-11", "currency": "USD", "customer_id": "TOTAL",
                       "revenue": per_token["revenue"], "cost": per_token["cost"], "margin": per_token["margin"],
                       "versus_baseline": ""}


@pytest.fixture
def cli_env(synthetic_db, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", synthetic_db)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    yield synthetic_db
    get_settings.cache_clear()


def test_cli_compare_json_console_and_errors(cli_env, tmp_path):
    runner = CliRunner()
    args = ["compare", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-02T02:00:00Z"]
    for b in BOOKS:
        args += ["--price-book", str(b)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert [b["id"] for b in json.loads(result.stdout)["books"]][0] == "per-token-2026-11"

    result = runner.invoke(app, [*args, "--csv", str(tmp_path / "x.csv")])
    assert result.exit_code == 0, result.output
    assert "Revenue, cost and gross margin per book" in result.stdout
    assert (tmp_path / "x.csv").exists()

    bad = runner.invoke(app, ["compare", "--from", "2026-11-02T00:30:00Z", "--to", "2026-11-02T02:00:00Z",
                              "--price-book", str(BOOKS[0])])
    assert bad.exit_code == 2
    assert "not a whole hour" in bad.output and "Traceback" not in bad.output

    broken = tmp_path / "broken.yaml"
    broken.write_text('id: x\ncurrency: USD\ncharges:\n  - meter: tokens\n    price: {type: unit, amount: "1", per: 1}\n')
    bad = runner.invoke(app, [*args[:5], "--price-book", str(broken)])
    assert bad.exit_code == 2
    assert f"{broken}: charges[0].meter: unknown meter 'tokens'" in bad.output.replace("\n", "")
    missing = runner.invoke(app, [*args[:5], "--price-book", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "cannot read the file" in missing.output


def test_example_books_and_cost_model_are_valid():
    from pricing_service.books import EXAMPLE_BOOKS_DIR, book_paths, read_cost_model, read_price_book
    from pricing_service.compare import default_book_paths

    assert [read_price_book(p).id for p in default_book_paths()] == ["per-token-2026-11", "gpu-hour-2026-11", "per-task-2026-11"]
    assert sorted(p.name for p in book_paths(None)) == ["gpu-hour.yaml", "per-task.yaml", "per-token.yaml"]
    assert all(p.parent == EXAMPLE_BOOKS_DIR for p in book_paths(None))
    assert read_cost_model(None).gpu_hour["H100"] > 0
