"""Fitting on metered history, the versions kept in PostgreSQL, `predict fit|status`, the refit schedule."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from prediction import RequestFeatures
from prediction_service import store
from prediction_service.schedule import RefitSchedule
from tests.prediction_service.conftest import MONTH

FITTED_AT = datetime(2026, 12, 2, tzinfo=UTC)


def test_a_fit_is_a_new_version_with_its_window_and_rows(demo_conn):
    first = store.fit(demo_conn, *MONTH, now=FITTED_AT)
    second = store.fit(demo_conn, MONTH[0], datetime(2026, 11, 15, tzinfo=UTC), now=FITTED_AT, trigger="schedule")
    assert second.version == first.version + 1
    assert (first.requests, first.window_start, first.window_end) == (12_000, *MONTH)
    assert 0 < second.requests < first.requests and first.tasks > second.tasks > 500
    fitted = store.latest(demo_conn)
    assert fitted.info == second
    p = fitted.requests.predict_request(RequestFeatures("cust-001", "kimi-chat", 5000))
    assert p.basis == "customer_model_bucket" and 0 < p.output_tokens_p50 < p.output_tokens_p90 < p.output_tokens_p99
    assert 0 < p.failure_probability < 0.05 and 0 < p.cached_fraction < 1
    status = store.status(demo_conn)
    assert status["fitted"] and status["version"] == second.version and status["trigger"] == "schedule"
    assert status["models"] == ["kimi-chat", "kimi-chat-lite"] and status["customers"] == 50
    assert [f["version"] for f in status["fits"]][:2] == [second.version, first.version]
    tasks = fitted.tasks.predict_task("cust-002", "kimi-chat")
    assert tasks.basis == "customer_model" and 0.7 < tasks.success_probability < 1


def test_status_before_any_fit(db_url):
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        assert store.status(conn) == {"fitted": False, "message": str(store.NotFitted()), "fits": []}
        assert store.latest(conn) is None


def test_predict_fit_and_status_commands(db_url, cli):
    empty = cli(db_url, "predict", "status")
    assert empty.code == 0 and "no predictors fitted yet" in empty.out
    fitted = cli(db_url, "predict", "fit", "--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z", "--json")
    assert fitted.code == 0, fitted.err
    info = json.loads(fitted.out)
    assert info["window"] == {"from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"} and info["requests"] == 0
    status = cli(db_url, "predict", "status", "--json")
    assert json.loads(status.out)["version"] == info["version"]
    text = cli(db_url, "predict", "status")
    assert f"version {info['version']}" in text.out and "cli" in text.out
    bad = cli(db_url, "predict", "fit", "--from", "2026-11-01T00:00:00Z")
    assert bad.code == 2 and "give both --from and --to" in bad.err and "Traceback" not in bad.err


def test_the_schedule_refits_the_window_before_the_current_hour(db_url):
    settings = Settings(DATABASE_URL=db_url, INFERMETER_PREDICT_REFIT_INTERVAL_S=3600, INFERMETER_PREDICT_WINDOW_DAYS=7)
    schedule = RefitSchedule(settings, db_url, clock=lambda: datetime(2026, 11, 20, 10, 30, tzinfo=UTC))
    info = schedule.fit_once()
    assert (info.window_start, info.window_end, info.trigger) == (
        datetime(2026, 11, 13, 10, tzinfo=UTC), datetime(2026, 11, 20, 10, tzinfo=UTC), "schedule")
    schedule.start()
    schedule.stop()
    assert schedule.fits >= 1
    off = RefitSchedule(Settings(DATABASE_URL=db_url, INFERMETER_PREDICT_REFIT_INTERVAL_S=0), db_url).start()
    assert off._thread is None
    off.stop()
