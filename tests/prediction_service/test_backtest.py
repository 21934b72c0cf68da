"""The backtest on metered history (real PostgreSQL): no look-ahead, and the coverage it reaches on the
bundled trace, against the online median."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from bench.prediction import write_events
from infermeter.stack.postgres import to_libpq_url
from metering.contract import encode_event, request_event
from prediction_service.evaluate import backtest_window
from tests.prediction_service.conftest import MONTH

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _request(i: int, started: datetime, seconds: float, output: int, customer: str = "acme") -> bytes:
    return encode_event(request_event(
        source="//test/gw", request_id=f"r-{i}", customer_id=customer, api_key_id=None, model="m1",
        deployment_id="d1", status="ok", input_tokens=800, cached_input_tokens=0, output_tokens=output,
        started_at=started, finished_at=started + timedelta(seconds=seconds)))


def test_a_planted_future_outlier_cannot_change_an_earlier_prediction(db_url):
    """300 requests a minute apart, each running 30 s; then an outlier (a million output tokens) admitted at
    minute 100 and finishing 20 s later is metered. Every request admitted before it finished is
    predicted exactly as before; requests after it see it."""
    write_events(db_url, [_request(i, T0 + timedelta(minutes=i), 30, 100 + i % 50) for i in range(300)])
    window = (T0, T0 + timedelta(days=1))
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        before = {r.request.event_id: r.to_json() for r in backtest_window(conn, *window)}
    write_events(db_url, [_request(9999, T0 + timedelta(minutes=100), 20, 1_000_000)])
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        after = {r.request.event_id: r.to_json() for r in backtest_window(conn, *window)}
    assert len(after) == 301 and "r-9999" in after
    for i in range(101):  # admitted at or before minute 100, before the outlier finished
        assert after[f"r-{i}"] == before[f"r-{i}"], i
    assert any(after[f"r-{i}"]["output_tokens_p99"] != before[f"r-{i}"]["output_tokens_p99"] for i in range(101, 300))


def test_coverage_on_the_bundled_trace_beats_the_online_median(demo_month, demo_conn):
    from prediction.scoring import Scored, score

    rows = backtest_window(demo_conn, *MONTH)
    assert len(rows) == 12_000  # one row per request event of the month
    result = score(Scored(r.request.customer_id, r.request.model, r.request.status, r.request.output_tokens,
                          r.request.cached_fraction, r.request.failed, r.prediction, r.baseline_p50)
                   for r in rows)["all"]
    assert 0.87 <= result["coverage_p90"] <= 0.93, result
    assert result["coverage_p99"] >= 0.98, result
    assert result["mae_p50"] <= result["baseline_mae_p50"], result
