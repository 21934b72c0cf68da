"""The predictors and the alerts on the dashboards, in Chromium against the real API app: request events
that carry the prediction made at admission, metered through Kafka and the consumer (some delivered
twice), then the operations page's evaluation table equals `infermeter predict eval --json`, and the
customer page's invoice forecast and alerts equal `infermeter predict forecast --json` and `infermeter
alerts list --json`. A site of its own: the package's site counts its events exactly."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import create_engine

from app.api import create_app
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from serving.keys import KeyStore
from tests.conftest import new_database
from tests.dashboards.conftest import Page, Site, infermeter, served
from tests.dashboards.test_pages import shoot
from tests.metering.conftest import meter
from tests.prediction_service.test_admission_eval import predicted_stream

WINDOW = ("2026-11-02T09:00:00Z", "2026-11-02T13:00:00Z")
SETUP_AT = datetime(2026, 10, 25, tzinfo=UTC)
AS_OF = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)  # the customer page's billing figures and forecast
ALERTED_AT = datetime(2026, 11, 4, 8, 30, tzinfo=UTC)
SCORES = ("requests", "mae_p50", "coverage_p90", "coverage_p99")


@pytest.fixture(scope="module")
def predicted_site(pg_server_url, kafka_bootstrap, tmp_path_factory):
    from alerts.evaluate import send_test
    from alerts.store import set_endpoint
    from billing_service.customers import assign_plan, set_customer
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    name = f"pred{int(time.time() * 1000) % 10**8}"
    settings = Settings(
        INFERMETER_HOME=tmp_path_factory.mktemp("pred-home"), DATABASE_URL=new_database(pg_server_url),
        KAFKA_BOOTSTRAP=kafka_bootstrap, INFERMETER_TOPIC_PREFIX=name, INFERMETER_CONSUMER_GROUP=f"{name}-group",
        INFERMETER_BATCH_MAX_WAIT_MS=50, INFERMETER_SESSION_TTL_S=600, INFERMETER_AUTH_FAILURES_ALLOWED=10_000,
    )
    lines = predicted_stream()
    counts = meter(settings, lines + lines[:15])  # some events delivered twice: scored once
    assert (counts.accepted, counts.duplicates) == (len(lines), 15), counts
    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    with psycopg.connect(to_libpq_url(settings.database_url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        set_customer(conn, "cust-a", now=SETUP_AT, name="CUST-A")
        assign_plan(conn, "cust-a", book.read_text(), str(book), "2026-11-01", now=SETUP_AT)
        conn.commit()
        set_endpoint(conn, "https://hooks.example.com/infermeter", customer_id="cust-a", now=SETUP_AT)
        send_test(conn, "cust-a", now=ALERTED_AT)  # an alert of cust-a's, its delivery left pending
        conn.commit()
    store = KeyStore(create_engine(settings.database_url), settings=settings, cache_ttl_s=0)
    keys = {"a": store.create("cust-a")[1], "b": store.create("cust-b")[1], "admin": settings.admin_token}
    app = create_app(settings, settings.database_url, None, keys=store, billing_clock=lambda: AS_OF)
    with served(app) as url:
        yield Site(url, settings, keys, store, app)


@pytest.fixture
def page(browser, predicted_site):
    opened = Page(browser, predicted_site)
    yield opened
    opened.close()


def _cells(page: Page, model: str) -> dict[str, tuple[str, str | None]]:
    """The evaluation table's row of `model` ('' for all models): each cell's text and data-value."""
    return page.page.eval_on_selector_all(
        f"[data-testid=evaluation] tbody tr[data-model='{model}'] td",
        "cells => Object.fromEntries(cells.map(c => [c.dataset.testid, [c.innerText, c.dataset.value ?? null]]))")


def _shown(scores: dict, key: str) -> str:
    value = scores[key]
    if key == "requests":
        return f"{value:,}"
    return f"{value * 100:.1f}%" if key.startswith("coverage") else f"{value:.1f}"


def test_operations_page_evaluation_equals_the_cli_json(page, predicted_site):
    expected = infermeter(predicted_site, "predict", "eval", "--from", WINDOW[0], "--to", WINDOW[1], "--no-spend")
    admission, backtest = expected["admission"], expected["models"]
    assert admission["all"]["requests"] > 0 and [m["model"] for m in admission["models"]] == ["m1", "m2"]
    page.admin_sign_in(predicted_site.keys["admin"])
    page.goto(f"/admin/ops?from={WINDOW[0]}&to={WINDOW[1]}")
    for model in ("m1", "m2", ""):
        cells = _cells(page, model)
        wanted = {"admission": next(m for m in admission["models"] if m["model"] == model) if model else admission["all"],
                  "backtest": next(m for m in backtest if m["model"] == model) if model else expected["all"]}
        for kind, keys in (("admission", SCORES), ("backtest", (*SCORES, "baseline_mae_p50"))):
            for key in keys:
                text, value = cells[f"{kind}-{key}"]
                assert float(value) == wanted[kind][key], (model, kind, key)
                assert text == _shown(wanted[kind], key), (model, kind, key)
    assert page.page.query_selector("[data-testid=no-admission-predictions]") is None
    assert not page.problems, page.problems
    shoot(page, "operations-predictions")


def test_operations_page_says_when_no_prediction_was_made_at_admission(page, predicted_site):
    page.admin_sign_in(predicted_site.keys["admin"])
    page.goto("/admin/ops?from=2026-11-03T00:00:00Z&to=2026-11-03T06:00:00Z")
    assert "No request in these hours" in page.text("no-admission-predictions")
    assert _cells(page, "")["admission-requests"][0] == "-"


def test_customer_page_shows_its_invoice_forecast_and_alerts_as_the_cli(page, predicted_site):
    [forecast] = infermeter(predicted_site, "predict", "forecast", "--customer", "cust-a",
                            "--as-of", AS_OF.isoformat())["customers"]
    assert forecast["available"] and forecast["forecast"] is not None
    alerts = infermeter(predicted_site, "alerts", "list", "--customer", "cust-a")["alerts"]
    assert [a["kind"] for a in alerts] == ["test"]
    page.sign_in(predicted_site.keys["a"])
    page.goto(f"/dashboard?from={WINDOW[0]}&to={WINDOW[1]}")
    currency = forecast["currency"]
    assert page.text("forecast-period") == forecast["period"]
    assert page.text("forecast-to-date") == f"{forecast['spend_to_date']} {currency}"
    assert page.text("forecast-expected") == f"{forecast['forecast']['expected']} {currency}"
    assert (page.text("forecast-low"), page.text("forecast-high")) == (forecast["forecast"]["low"],
                                                                       forecast["forecast"]["high"])
    shown = page.page.eval_on_selector_all("[data-testid=alerts-table] tbody tr[data-alert]", """rows => rows.map(r => ({
        id: r.dataset.alert, kind: r.children[1].innerText, threshold: r.children[2].innerText,
        period: r.children[3].innerText}))""")
    assert shown == [{"id": a["alert_id"], "kind": a["kind"], "threshold": a["threshold"], "period": a["period"]}
                     for a in alerts]
    body = page.page.inner_text("main").lower()
    assert "margin" not in body and "cost" not in body
    assert not page.problems, page.problems
    shoot(page, "customer-forecast-alerts")


def test_a_customer_without_a_plan_or_alerts_is_told_so(page, predicted_site):
    page.sign_in(predicted_site.keys["b"])
    page.goto(f"/dashboard?from={WINDOW[0]}&to={WINDOW[1]}")
    assert page.text("forecast-message") == "No invoice forecast: unknown customer cust-b"
    assert page.text("no-alerts") == "No alerts."
