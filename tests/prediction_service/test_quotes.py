"""Quotes on the demo month: the CLI and POST /v1/quotes, and their clear errors."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url
from prediction_service import store
from prediction_service.quotes import QuoteRefused, quote
from tests.prediction_service.conftest import MONTH, QUOTE_AT


@pytest.fixture(scope="module")
def fitted_month(demo_month):
    """The demo month with a fit committed (module scope: the fit stays)."""
    with psycopg.connect(to_libpq_url(demo_month.url)) as conn:
        store.fit(conn, *MONTH, now=QUOTE_AT)
    return demo_month


def test_a_quote_prices_a_request_and_a_successful_task(fitted_month, demo_conn):
    q = quote(demo_conn, "cust-002", "kimi-chat", 5000, at=QUOTE_AT, task_steps=3)
    assert (q["currency"], q["price_book"], q["period"], q["interval"]) == ("USD", "per-token-2026-11", "2026-11", "80%")
    r, t = q["request"], q["task"]
    assert Decimal(r["low"]) <= Decimal(r["median"]) <= Decimal(r["high"])
    assert Decimal(r["low"]) < Decimal(r["expected"]) < Decimal(r["high"])
    assert Decimal(t["low"]) <= Decimal(t["median"]) <= Decimal(t["high"]) and t["steps"] == 3 and t["steps_given"]
    assert Decimal(t["expected"]) > 3 * Decimal(r["expected"])  # three steps, and retries and failed tasks on top
    assert t["history"]["basis"] == "customer_model" and q["not_quoted"] == []
    default = quote(demo_conn, "cust-002", "kimi-chat", 5000, at=QUOTE_AT)
    assert default["task"]["steps"] == default["task"]["history"]["typical_steps"] and not default["task"]["steps_given"]
    capped = quote(demo_conn, "cust-002", "kimi-chat", 5000, at=QUOTE_AT, max_tokens=10)
    assert Decimal(capped["request"]["high"]) < Decimal(r["low"]) or capped["request"]["prediction"]["output_tokens_p99"] == 10


@pytest.mark.parametrize(("args", "code", "status", "message"), [
    (("ghost", "kimi-chat", 100), "unknown_customer", 404, "unknown customer ghost"),
    (("cust-002", "gpt-9", 100), "unknown_model", 404, "unknown model gpt-9: the predictors know kimi-chat"),
    (("no-plan", "kimi-chat", 100), "no_plan", 409, "has no price plan for the period 2026-11"),
    (("cust-002", "kimi-chat", 0), "invalid_request", 400, "prompt_tokens must be from 1"),
    (("cust-002", "kimi-chat", -5), "invalid_request", 400, "prompt_tokens must be from 1"),
    (("cust-002", "kimi-chat", "many"), "invalid_request", 400, "prompt_tokens must be a whole number"),
    (("cust-002", "kimi-chat", 1.5), "invalid_request", 400, "prompt_tokens must be a whole number"),
    (("cust-002", "", 10), "invalid_request", 400, "model must be a non-empty string"),
])
def test_bad_quotes_are_refused_with_a_code(fitted_month, demo_conn, args, code, status, message):
    with pytest.raises(QuoteRefused) as refused:
        quote(demo_conn, *args, at=QUOTE_AT)
    assert (refused.value.code, refused.value.status) == (code, status)
    assert message in str(refused.value)
    with pytest.raises(QuoteRefused, match="task_steps must be from 1 to 1000"):
        quote(demo_conn, "cust-002", "kimi-chat", 10, at=QUOTE_AT, task_steps=0)


def test_no_fit_no_quote(db_url):
    from billing_service.customers import set_customer

    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        set_customer(conn, "acme", now=QUOTE_AT)
        with pytest.raises(QuoteRefused) as refused:
            quote(conn, "acme", "m", 10, at=QUOTE_AT)
    assert (refused.value.code, refused.value.status) == ("not_fitted", 409)


def test_quote_command(fitted_month, cli):
    result = cli(fitted_month.url, "quote", "--customer", "cust-002", "--model", "kimi-chat", "--prompt-tokens", "5000",
                 "--task-steps", "2", "--at", "2026-11-20T00:00:00Z", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["task"]["steps"] == 2
    text = cli(fitted_month.url, "quote", "--customer", "cust-002", "--model", "kimi-chat", "--prompt-tokens", "5000",
               "--at", "2026-11-20T00:00:00Z")
    assert "per request:" in text.out and "per successful task of" in text.out
    for args, message in [
        (["--customer", "ghost", "--model", "kimi-chat", "--prompt-tokens", "10"], "unknown customer ghost"),
        (["--customer", "cust-002", "--model", "gpt-9", "--prompt-tokens", "10"], "unknown model gpt-9"),
        (["--customer", "cust-002", "--model", "kimi-chat", "--prompt-tokens", "0"], "prompt_tokens must be from 1"),
        (["--customer", "cust-002", "--model", "kimi-chat", "--prompt-tokens", "10", "--task-steps", "-1"],
         "task_steps must be from 1"),
    ]:
        bad = cli(fitted_month.url, "quote", *args, "--at", "2026-11-20T00:00:00Z")
        assert bad.code == 2, (args, bad.out, bad.err)
        assert bad.err.strip().splitlines() == [f"error: {bad.err.strip()[7:]}"] and message in bad.err
    not_a_number = cli(fitted_month.url, "quote", "--customer", "cust-002", "--model", "kimi-chat", "--prompt-tokens",
                       "ten")
    assert not_a_number.code == 2 and "Invalid value" in not_a_number.err  # typer's own usage error
    assert "Traceback" not in not_a_number.err + not_a_number.out


@pytest.fixture
def api(fitted_month, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine

    from app.api import create_app
    from infermeter.settings import Settings
    from serving.keys import KeyStore

    settings = Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=fitted_month.url)
    keys = KeyStore(create_engine(fitted_month.url), settings=settings)
    app = create_app(settings, fitted_month.url, None, clock=lambda: QUOTE_AT)
    with TestClient(app) as client:
        yield client, {"cust-002": keys.create("cust-002")[1], "ghost": keys.create("ghost")[1],
                       "admin": settings.admin_token, "producer": settings.producer_token}


def _post(client, token, body):
    return client.post("/v1/quotes", headers={"Authorization": f"Bearer {token}"},
                       content=body if isinstance(body, bytes) else json.dumps(body))


def test_post_quotes_with_a_customer_key(api):
    client, keys = api
    ok = _post(client, keys["cust-002"], {"model": "kimi-chat", "prompt_tokens": 5000, "task_steps": 3})
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["customer_id"] == "cust-002" and body["task"]["steps"] == 3 and body["request"]["expected"]
    admin = _post(client, keys["admin"], {"model": "kimi-chat", "prompt_tokens": 5000, "customer_id": "cust-002"})
    assert admin.status_code == 200 and admin.json()["request"] == {**body["request"]}


@pytest.mark.parametrize(("who", "body", "status", "code"), [
    ("cust-002", {"model": "gpt-9", "prompt_tokens": 10}, 404, "unknown_model"),
    ("ghost", {"model": "kimi-chat", "prompt_tokens": 10}, 404, "unknown_customer"),
    ("cust-002", {"model": "kimi-chat", "prompt_tokens": 0}, 400, "invalid_request"),
    ("cust-002", {"model": "kimi-chat", "prompt_tokens": "10"}, 400, "invalid_request"),
    ("cust-002", {"model": "kimi-chat", "prompt_tokens": 10, "task_steps": 0}, 400, "invalid_request"),
    ("cust-002", {"model": "kimi-chat"}, 400, "invalid_request"),
    ("cust-002", {"model": "kimi-chat", "prompt_tokens": 10, "colour": "red"}, 400, "invalid_request"),
    ("cust-002", b"not json", 400, "invalid_request"),
    ("cust-002", [1, 2], 400, "invalid_request"),
    ("cust-002", {"model": "kimi-chat", "prompt_tokens": 10, "customer_id": "cust-003"}, 404, "not_found"),
    ("admin", {"model": "kimi-chat", "prompt_tokens": 10}, 400, "invalid_request"),
    ("admin", {"model": "kimi-chat", "prompt_tokens": 10, "customer_id": "no-plan"}, 409, "no_plan"),
    ("producer", {"model": "kimi-chat", "prompt_tokens": 10, "customer_id": "cust-002"}, 403, "forbidden"),
])
def test_post_quotes_errors_in_the_documented_shape(api, who, body, status, code):
    client, keys = api
    response = _post(client, keys[who], body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_predictions_status_is_for_admins(api):
    client, keys = api
    assert client.get("/v1/predictions/status", headers={"Authorization": f"Bearer {keys['admin']}"}).json()["fitted"]
    assert client.get("/v1/predictions/status",
                      headers={"Authorization": f"Bearer {keys['cust-002']}"}).status_code == 403
