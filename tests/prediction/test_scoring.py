"""Scores: pinball loss, coverage, interval calibration, per group."""

from decimal import Decimal

import pytest

from prediction.request import RequestPrediction
from prediction.scoring import Scored, interval_coverage, pinball, score


@pytest.mark.parametrize(("q", "actual", "predicted", "loss"), [
    (0.9, 100, 100, 0.0), (0.9, 110, 100, 9.0), (0.9, 90, 100, 1.0), (0.99, 200, 100, 99.0), (0.99, 0, 100, 1.0),
    (0.5, 10, 0, 5.0), (0.5, 0, 10, 5.0),
])
def test_pinball(q, actual, predicted, loss):
    assert pinball(q, actual, predicted) == pytest.approx(loss)


def _row(customer, output, p50=100, p90=200, p99=300, baseline=100, status="ok"):
    return Scored(customer, "m", status, output, 0.5, status == "error",
                  RequestPrediction(0, p50, p90, p99, 0.0, 0.25, 0.1, "global", 10), baseline)


def test_score_by_group_and_overall():
    rows = [_row("a", 100), _row("a", 250), _row("b", 400, baseline=400), _row("b", 0, status="rejected")]
    result = score(rows)
    overall = result["all"]
    assert overall["requests"] == 3
    assert overall["mae_p50"] == pytest.approx((0 + 150 + 300) / 3)
    assert overall["baseline_mae_p50"] == pytest.approx((0 + 150 + 0) / 3)
    assert overall["coverage_p90"] == pytest.approx(1 / 3) and overall["coverage_p99"] == pytest.approx(2 / 3)
    assert overall["pinball_p90"] == pytest.approx((0.9 * 0 + 0.1 * 100 + 0.9 * 50 + 0.9 * 200) / 3)
    assert overall["cached_fraction_mae"] == pytest.approx(0.25)
    assert overall["failure_brier"] == pytest.approx(0.01)
    assert [(g["customer_id"], g["requests"]) for g in result["groups"]] == [("a", 2), ("b", 1)]


def test_interval_coverage_counts_the_edges_inside():
    d = Decimal
    result = interval_coverage([(d(1), d(2), d(1)), (d(1), d(2), d(2)), (d(1), d(2), d("2.01")), (d(1), d(2), d(0))])
    assert result == {"periods": 4, "inside": 2, "coverage": 0.5}
    assert interval_coverage([]) == {"periods": 0, "inside": 0, "coverage": None}
