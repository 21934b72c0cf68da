"""Per-period forecasts on the demo month (real PostgreSQL): the spend forecast's calibration at
mid-period, credit and budget run-out, the platform's margin per book."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from prediction_service.forecast import customer_forecasts, platform_forecasts, spend_calibration
from pricing_service.books import read_cost_model, read_price_book
from pricing_service.compare import default_book_paths
from tests.prediction_service.conftest import MONTH

MID = datetime(2026, 11, 16, tzinfo=UTC)


def test_the_mid_period_spend_forecast_holds_the_actual_in_its_80_percent_interval(demo_conn):
    periods = spend_calibration(demo_conn, *MONTH)
    # the 49 UTC customers' November; cust-002's Kolkata period ends on Nov 30 18:30Z, also inside
    assert len(periods) == 50, [p.to_json() for p in periods]
    inside = sum(p.inside for p in periods) / len(periods)
    print(f"spend interval coverage {inside:.2%}")
    assert 0.70 <= inside <= 0.90, [p.to_json() for p in periods if not p.inside]


def test_customer_forecasts_with_credit_and_budget(demo_conn):
    budgets = {"cust-001": (Decimal("1.00"), Decimal("0.50")), "cust-002": (Decimal("1.00"), Decimal("0.50"))}
    rows = customer_forecasts(demo_conn, MID, customer_ids=["cust-001", "cust-002", "cust-003", "no-plan", "ghost"],
                              budgets=lambda c, at: budgets.get(c))
    by = {r["customer_id"]: r for r in rows}
    assert by["ghost"] == {"customer_id": "ghost", "available": False, "message": "unknown customer ghost"}
    assert not by["no-plan"]["available"] and "no price plan" in by["no-plan"]["message"]
    one, three = by["cust-001"], by["cust-003"]
    assert one["period"] == "2026-11" and one["days_observed"] == 15 and one["price_book"] == "per-token-2026-11"
    f = one["forecast"]
    assert Decimal(f["low"]) <= Decimal(f["median"]) <= Decimal(f["high"])
    assert Decimal(one["spend_to_date"]) <= Decimal(f["low"])
    assert "credit" not in one and "budget" not in three
    budget = one["budget"]
    assert budget["available"] == "1.00" and budget["used"] == "0.50" and budget["month_end"] == "2026-12-01T00:00:00Z"
    assert MID.isoformat().replace("+00:00", "Z") < budget["runs_out_at"]
    # a budget resets with the customer's billing period: cust-002's (Asia/Kolkata) ends at 18:30Z
    assert by["cust-002"]["budget"]["month_end"] == "2026-11-30T18:30:00Z"
    credit = three["credit"]  # 10.00 of prepaid credit
    assert credit["available"] == "10.00" and credit["used"] == three["spend_to_date"]


def test_platform_margin_per_book(demo_conn):
    books = [read_price_book(p) for p in default_book_paths()]
    result = platform_forecasts(demo_conn, MID, books, read_cost_model(None))
    assert result["month"] == {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    assert [b["price_book"] for b in result["books"]] == [b.id for b in books]
    for b in result["books"]:
        revenue, cost, margin = b["revenue"], b["cost"], b["margin"]
        assert Decimal(b["revenue_to_date"]) <= Decimal(revenue["low"]) <= Decimal(revenue["high"])
        assert Decimal(b["cost_to_date"]) <= Decimal(cost["low"])
        # each rounded to the cent on its own
        assert abs(Decimal(margin["expected"]) - (Decimal(revenue["expected"]) - Decimal(cost["expected"]))) <= Decimal(
            "0.01")


def test_predict_forecast_command(demo_month, cli):
    import json

    result = cli(demo_month.url, "predict", "forecast", "--customer", "cust-003", "--customer", "no-plan", "--as-of",
                 "2026-11-16T00:00:00Z", "--json")
    assert result.code == 0, result.err
    rows = {r["customer_id"]: r for r in json.loads(result.out)["customers"]}
    assert rows["cust-003"]["forecast"]["interval"] == "80%" and rows["cust-003"]["credit"]["available"] == "10.00"
    assert not rows["no-plan"]["available"]
    text = cli(demo_month.url, "predict", "forecast", "--customer", "cust-003", "--as-of", "2026-11-16T00:00:00Z")
    assert "cust-003" in text.out and "2026-11" in text.out
    bad = cli(demo_month.url, "predict", "forecast", "--as-of", "mid-november")
    assert bad.code == 2 and "not an ISO 8601 time" in bad.err
