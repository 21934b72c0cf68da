"""Shadow rating: live running revenue of the current period, per customer, under every candidate book;
over HTTP a customer sees only itself."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient

from app.api import create_app
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from pricing_service.api import router
from pricing_service.books import book_paths, read_cost_model, read_price_book
from pricing_service.shadow import shadow_rating

TEST_BOOKS = Path(__file__).parent / "books"
NOW = datetime(2026, 11, 2, 1, 30, tzinfo=UTC)
AS_OF = "2026-11-02T01:30:00Z"


def test_shadow_is_live_and_matches_one_customer_view(synthetic_db):
    books = [read_price_book(p) for p in book_paths([TEST_BOOKS])]
    cost_model = read_cost_model(TEST_BOOKS / "cost-model.yaml")
    everyone = shadow_rating(synthetic_db, books, cost_model, now=NOW)
    assert everyone.period_start == datetime(2026, 11, 1, tzinfo=UTC)
    assert {x.customer_id for x in everyone.lines} == {"cust-1", "cust-2", "cust-3", "cust-4"}
    for customer in ("cust-1", "cust-3"):
        alone = shadow_rating(synthetic_db, books, cost_model, now=NOW, customer_id=customer)
        assert [x for x in everyone.lines if x.customer_id == customer] == list(alone.lines)

    def per_token(report, customer):
        return next(x.revenue_to_date for x in report.lines if x.customer_id == customer and x.book_id.startswith("per-token"))

    before = per_token(everyone, "cust-4")
    # usage arrives: metering bumps the current hour's rollup; the next query sees it
    with psycopg.connect(to_libpq_url(synthetic_db)) as conn:
        conn.execute(
            "UPDATE request_rollup_hourly SET output_tokens = output_tokens + 4000000 "
            "WHERE customer_id = 'cust-4' AND hour = '2026-11-02T01:00:00Z'"
        )
    after = per_token(shadow_rating(synthetic_db, books, cost_model, now=NOW), "cust-4")
    assert after - before == Decimal("10.00")  # 4M output tokens x 2.50 / M


def test_shadow_endpoint_scopes_customers(synthetic_db, tmp_path):
    settings = Settings(INFERMETER_HOME=tmp_path, DATABASE_URL=synthetic_db, INFERMETER_PRICING_BOOKS=str(TEST_BOOKS),
                        INFERMETER_PRICING_COST_MODEL=str(TEST_BOOKS / "cost-model.yaml"))
    app = create_app(settings, synthetic_db, None, clock=lambda: NOW)
    app.include_router(router)
    _, token = app.state.keys.create("cust-3")
    with TestClient(app) as client:
        admin = client.get("/v1/pricing/shadow", headers={"Authorization": f"Bearer {settings.admin_token}"})
        assert admin.status_code == 200, admin.text
        body = admin.json()
        assert body["live"] is True and len(body["customers"]) == 4
        assert len(body["customers"][0]["books"]) == 3
        mine = client.get("/v1/pricing/shadow", headers={"Authorization": f"Bearer {token}"})
        assert [c["customer_id"] for c in mine.json()["customers"]] == ["cust-3"]
        other = client.get("/v1/pricing/shadow?customer_id=cust-1", headers={"Authorization": f"Bearer {token}"})
        assert other.status_code == 404
        assert client.get("/v1/pricing/shadow").status_code == 401
    app.state.pool.close()


def test_cli_shadow_prints_a_table_and_json(synthetic_db, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from infermeter.settings import get_settings
    from pricing_service.cli import app as cli

    monkeypatch.setenv("DATABASE_URL", synthetic_db)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INFERMETER_PRICING_BOOKS", str(TEST_BOOKS))
    monkeypatch.setenv("INFERMETER_PRICING_COST_MODEL", str(TEST_BOOKS / "cost-model.yaml"))
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        table = runner.invoke(cli, ["shadow", "--as-of", AS_OF])
        assert table.exit_code == 0, table.output
        assert "live" in table.stdout and "cust-4" in table.stdout
        one = runner.invoke(cli, ["shadow", "--customer", "cust-4", "--json", "--as-of", AS_OF])
        assert one.exit_code == 0, one.output
        body = json.loads(one.stdout)
        assert [c["customer_id"] for c in body["customers"]] == ["cust-4"]
        assert body["period"] == {"from": "2026-11-01T00:00:00Z", "to": "2026-11-02T02:00:00Z"}
    finally:
        get_settings.cache_clear()
