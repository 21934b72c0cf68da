"""The backtest predicts each request from what had finished before it was admitted, and nothing else."""

from __future__ import annotations

from datetime import timedelta

from prediction.backtest import OnlineMedian, backtest
from prediction.request import MIN_ROWS
from tests.prediction.helpers import T0, obs


def _history(n: int = 300) -> list:
    return [obs(i, output=100 + i % 50, started=T0 + timedelta(minutes=i), seconds=30) for i in range(n)]


def test_a_planted_future_outlier_changes_no_earlier_prediction():
    window = _history()
    outlier = obs(9999, output=10**6, started=T0 + timedelta(minutes=100), seconds=20)  # finishes at 100:20
    plain = {r.request.event_id: r.prediction for r in backtest(window)}
    planted = {r.request.event_id: r.prediction for r in backtest([*window, outlier])}
    # requests admitted up to 100:20 (r-0 .. r-100) cannot know it; later ones do
    for i in range(101):
        assert planted[f"r-{i}"] == plain[f"r-{i}"], i
    assert any(planted[f"r-{i}"] != plain[f"r-{i}"] for i in range(101, 300))


def test_a_request_finishing_at_the_admission_instant_is_not_known_yet():
    first = obs(1, output=50, started=T0, seconds=60)
    second = obs(2, output=70, started=T0 + timedelta(seconds=60))
    rows = backtest([first, second])
    assert rows[1].prediction.rows == 0 and rows[1].baseline_p50 == 0
    third = obs(3, output=70, started=T0 + timedelta(seconds=60, microseconds=1))
    assert backtest([first, third])[1].prediction.output_tokens_p50 == 50


def test_rows_come_in_admission_order_with_the_documented_json():
    window = [obs(i, started=T0 + timedelta(minutes=10 - i)) for i in range(5)]
    rows = backtest(window)
    assert [r.request.event_id for r in rows] == ["r-4", "r-3", "r-2", "r-1", "r-0"]
    assert set(rows[0].to_json()) == {"source", "id", "output_tokens_p50", "output_tokens_p90", "output_tokens_p99",
                                      "cached_fraction", "failure_probability"}


def test_history_before_the_window_warms_the_predictor():
    before = [obs(i, output=42, started=T0 - timedelta(days=1, minutes=-i)) for i in range(MIN_ROWS)]
    [row] = backtest([obs(1000, output=5)], before)
    assert row.prediction.output_tokens_p50 == 42 and row.prediction.basis == "customer_model_bucket"


def test_online_median_per_customer_and_model_then_global():
    median = OnlineMedian()
    assert median.predict("a", "m") == 0
    for v in (10, 20, 30):
        median.add("a", "m", v)
    median.add("b", "m", 1000)
    assert median.predict("a", "m") == 20
    assert median.predict("b", "m") == 1000
    assert median.predict("c", "m") == 30  # the global median of 10, 20, 30, 1000 (rank ceil(0.5 x 5) = 3)
