"""`infermeter alerts list|test|endpoint|thresholds` through app.cli.main, on real PostgreSQL and a real
receiver on loopback."""

from __future__ import annotations

import json

import pytest

from tests.alerts.conftest import SECRET
from tests.prediction_service.conftest import cli  # noqa: F401 - the fixture: `infermeter ...` on a database


@pytest.fixture
def run(cli, db_url):  # noqa: F811 - the fixture imported above
    """`infermeter ...` on the test's database: run("alerts", "list")."""
    return lambda *args: cli(db_url, *args)


def test_alerts_test_sends_a_signed_test_alert_and_list_shows_it_delivered(run, receiver):
    added = run("alerts", "endpoint", "set", "--url", receiver.url, "--secret", SECRET, "--customer", "acme", "--json")
    assert added.code == 0, added.err
    assert json.loads(added.out) | {"endpoint_id": None} == {
        "endpoint_id": None, "url": receiver.url, "customer_id": "acme", "secret": SECRET, "created": True}

    sent = run("alerts", "test", "--customer", "acme", "--json")
    assert sent.code == 0, sent.err
    result = json.loads(sent.out)
    [attempt] = result["attempts"]
    assert attempt["ok"] and attempt["outcome"] == "delivered" and attempt["status"] == 200
    assert receiver.answers() == [(200, "processed")]
    body = json.loads(receiver.requests[0].body)
    assert body["type"] == "alert.test" and body["id"] == attempt["delivery_id"] == receiver.requests[0].delivery_id

    listed = run("alerts", "list", "--customer", "acme", "--json")
    assert listed.code == 0, listed.err
    [alert] = json.loads(listed.out)["alerts"]
    assert alert["kind"] == "test" and alert["alert_id"] == result["alert_id"]
    assert [(d["status"], d["attempts"], d["last_status"]) for d in alert["deliveries"]] == [("delivered", 1, 200)]

    table = run("alerts", "list")
    assert table.code == 0 and "acme" in table.out and "delivered (1)" in table.out


def test_alerts_list_when_nothing_fired(run):
    shown = run("alerts", "list")
    assert shown.code == 0 and "No alert has fired." in shown.out
    assert json.loads(run("alerts", "list", "--json").out) == {"alerts": []}


@pytest.mark.parametrize(("args", "says"), [
    (("alerts", "test", "--customer", "nobody"), "no webhook endpoint takes nobody's alerts"),
    (("alerts", "endpoint", "set", "--url", "ftp://example.com/x"), "is not an http(s) URL"),
    (("alerts", "endpoint", "set", "--url", "http://127.0.0.1:9/x", "--secret", "short"), "at least 16 characters"),
    (("alerts", "thresholds", "set", "--customer", "acme", "--budget", "80,abc"), "'abc' is not a percentage"),
    (("alerts", "thresholds", "set", "--customer", "acme"), "give at least one of"),
    (("alerts", "endpoint", "remove", "we_missing"), "no endpoint 'we_missing'"),
])
def test_bad_input_is_one_line_and_exit_2(run, args, says):
    result = run(*args)
    assert result.code == 2 and says in result.err and result.err.count("\n") == 1, result.err


def test_thresholds_set_and_show(run):
    assert run("alerts", "thresholds", "set", "--customer", "acme", "--budget", "90", "--credit-runout-days", "3").code == 0
    shown = json.loads(run("alerts", "thresholds", "show", "--customer", "acme", "--json").out)
    assert shown["budget_percents"] == ["90"] and shown["credit_runout_days"] == 3
    assert shown["source"] == {"budget_percents": "customer", "credit_percents": "default",
                               "forecast_overspend": "default", "credit_runout_days": "customer"}
    assert run("alerts", "thresholds", "clear", "--customer", "acme").code == 0
    assert json.loads(run("alerts", "thresholds", "show", "--customer", "acme", "--json").out)["budget_percents"] == [
        "50", "80", "100"]
