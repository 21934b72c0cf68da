"""Which thresholds a customer has crossed: table-driven, no database (alerts.rules), and the signature."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from alerts.rules import (
    Forecast,
    Level,
    ThresholdError,
    Thresholds,
    amount_text,
    crossings,
    parse_percents,
    percent_used,
    reached,
)
from alerts.signing import new_secret, signature_header

NOW = datetime(2026, 11, 20, 10, tzinfo=UTC)
D = Decimal


@pytest.mark.parametrize(("used", "limit", "percent", "fires"), [
    ("50.00", "100.00", 50, True), ("49.99", "100.00", 50, False),
    ("80.00", "100.00", 80, True), ("79.99", "100.00", 80, False),
    ("100.00", "100.00", 100, True), ("99.99", "100.00", 100, False),
    ("100.01", "100.00", 100, True),
    ("16.665", "33.33", 50, True), ("16.664", "33.33", 50, False),  # exactly half of an odd cap
    ("0.00", "0.00", 50, True),  # a zero limit is reached by any spend
    ("0", "10.00", 50, False),
])
def test_a_percentage_fires_exactly_at_its_boundary(used, limit, percent, fires):
    assert reached(D(used), D(limit), D(percent)) is fires


@pytest.mark.parametrize(("used", "fired"), [
    ("49.99", []), ("50.00", ["50"]), ("79.99", ["50"]), ("80.00", ["50", "80"]),
    ("99.99", ["50", "80"]), ("100.00", ["50", "80", "100"]), ("250.00", ["50", "80", "100"]),
])
def test_budget_and_credit_thresholds_crossed(used, fired):
    level = Level("2026-11", D("100.00"), D(used), "USD")
    budget = crossings("acme", Thresholds(), now=NOW, budget=level)
    assert [(c.kind, c.threshold, c.period) for c in budget] == [("budget", p, "2026-11") for p in fired]
    credit = crossings("acme", Thresholds(), now=NOW, credit=level)
    assert [(c.kind, c.threshold) for c in credit] == [("credit", p) for p in fired]
    for c in budget:
        assert c.data == {"limit": "100.00", "used": used, "percent_used": used, "currency": "USD", "percent": c.threshold}


@pytest.mark.parametrize(("value", "shown"), [
    ("80.000000000000", "80.00"), ("80", "80.00"), ("0.123450", "0.12345"), ("79.99", "79.99"), ("0", "0.00"),
    ("1E+2", "100.00"),
])
def test_amounts_are_shown_exactly_with_two_decimals_at_least(value, shown):
    assert amount_text(D(value)) == shown


def test_the_percentage_shown_rounds_down():
    assert percent_used(D("49.999"), D("100")) == "49.99" and percent_used(D("1"), D("3")) == "33.33"
    assert percent_used(D("5"), D("0")) == "100.00"


@pytest.mark.parametrize(("median", "fires"), [("100.00", False), ("100.01", True), ("99.99", False)])
def test_forecast_overspend_fires_when_the_median_is_above_the_budget(median, fires):
    budget = Level("2026-11", D("100.00"), D("10.00"))
    forecast = Forecast("2026-11", D(median), D("80.00"), D("130.00"), "USD")
    found = [c for c in crossings("acme", Thresholds(), now=NOW, budget=budget, forecast=forecast)
             if c.kind == "forecast_overspend"]
    assert bool(found) is fires
    if fires:
        assert found[0].threshold == "p50" and found[0].data["forecast"]["median"] == median
    assert not crossings("acme", Thresholds(), now=NOW, forecast=forecast)  # no budget, nothing to overspend
    assert not [c for c in crossings("acme", Thresholds(forecast_overspend=False), now=NOW, budget=budget,
                                     forecast=forecast) if c.kind == "forecast_overspend"]


@pytest.mark.parametrize(("runs_out_at", "days", "fires"), [
    (NOW + timedelta(days=7), 7, True), (NOW + timedelta(days=7, microseconds=1), 7, False),
    (NOW, 7, True), (NOW + timedelta(days=2), 0, False), (None, 7, False), (NOW + timedelta(days=10), 14, True),
])
def test_credit_runout_within_n_days(runs_out_at, days, fires):
    credit = Level("2026-11", D("10.00"), D("1.00"))
    found = [c for c in crossings("acme", Thresholds(credit_percents=(), credit_runout_days=days), now=NOW,
                                  credit=credit, credit_runs_out_at=runs_out_at)]
    assert [(c.kind, c.threshold) for c in found] == ([("credit_runout", f"{days}d")] if fires else [])


@pytest.mark.parametrize(("text", "parsed"), [
    ("50,80,100", (50, 80, 100)), (" 80, 50 ,50", (50, 80)), ("", ()), ("none", ()), ("87.5%", (D("87.5"),)),
    ("1000", (1000,)), ("0.01", (D("0.01"),)),
])
def test_percentages_parse(text, parsed):
    assert parse_percents(text) == tuple(D(p) for p in parsed)


@pytest.mark.parametrize(("text", "says"), [
    ("0", "above 0"), ("-5", "above 0"), ("1000.01", "at most 1000"), ("abc", "not a percentage"),
    ("12.345", "two decimals"), ("NaN", "above 0"),
])
def test_bad_percentages_are_named(text, says):
    with pytest.raises(ThresholdError, match=says):
        parse_percents(text, "--budget")


def test_the_signature_is_stripes_scheme():
    secret, body = "whsec_known", b'{"id":"dlv_1"}'
    expected = hmac.new(b"whsec_known", b'1795165200.{"id":"dlv_1"}', hashlib.sha256).hexdigest()
    assert signature_header(secret, 1795165200, body) == f"t=1795165200,v1={expected}"
    assert new_secret().startswith("whsec_") and len(new_secret()) == 49 and new_secret() != new_secret()
