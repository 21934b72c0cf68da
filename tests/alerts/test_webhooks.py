"""Alerts end to end on real PostgreSQL and a real HTTP receiver on loopback: the 80% boundary, once per
threshold and period, retries with backoff, a replay recognised by its id, the documented signature."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from alerts import store
from alerts.delivery import Policy, deliver, deliver_due
from alerts.evaluate import evaluate
from alerts.rules import Thresholds
from alerts.schedule import AlertSchedule
from alerts.signing import signature_header
from infermeter.stack.postgres import to_libpq_url
from tests.alerts.conftest import NOW, SECRET, Receiver, docs_receiver

BUDGET_ONLY = Thresholds(credit_percents=(), forecast_overspend=False, credit_runout_days=0)
FAST = Policy(attempts=6, base_s=1.0, timeout_s=5.0)


def _fired(conn, budgets, *, defaults=BUDGET_ONLY):
    return [(f.crossing.kind, f.crossing.threshold, f.new, len(f.deliveries))
            for f in evaluate(conn, now=NOW, defaults=defaults, budgets=budgets)]


def _crossed(conn, spender, url: str, spent: str, *, cap: str = "100.00") -> None:
    """An endpoint for every customer's alerts at `url`, and acme spending `spent` of `cap`."""
    store.set_endpoint(conn, url, secret=SECRET, now=NOW)
    spender.cap("acme", cap)
    spender.spend("acme", spent)


def _alert_bodies(receiver: Receiver) -> list[dict]:
    return [json.loads(r.body) for r in receiver.requests]


def test_80_percent_fires_exactly_at_the_boundary_once_per_period(conn, budgets, spender, receiver, clock):
    _crossed(conn, spender, receiver.url, "79.99")

    assert _fired(conn, budgets) == [("budget", "50", True, 1)]  # 79.99%: the 80% threshold is not reached
    deliver(conn, FAST, _pending(conn), clock=clock, sleep=clock.sleep)
    assert [b["alert"]["threshold"] for b in _alert_bodies(receiver)] == ["50"]

    spender.spend("acme", "0.01")  # 80.00% exactly
    assert _fired(conn, budgets) == [("budget", "50", False, 0), ("budget", "80", True, 1)]
    deliver(conn, FAST, _pending(conn), clock=clock, sleep=clock.sleep)
    bodies = _alert_bodies(receiver)
    assert [b["alert"]["threshold"] for b in bodies] == ["50", "80"]
    assert bodies[1]["type"] == "alert.budget" and bodies[1]["alert"]["period"] == "2026-11"
    assert bodies[1]["alert"]["data"] == {"limit": "100.00", "used": "80.00", "percent_used": "80.00", "percent": "80"}

    # a second evaluation, and a third with the sender run again: nothing new, nothing sent again
    assert _fired(conn, budgets) == [("budget", "50", False, 0), ("budget", "80", False, 0)]
    assert deliver_due(conn, FAST, now=clock(), clock=clock) == []
    assert receiver.answers() == [(200, "processed")] * 2
    assert conn.execute("SELECT count(*) FROM alerts").fetchone()[0] == 2


def _pending(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT delivery_id FROM alert_deliveries WHERE status = 'pending'")]


def test_the_unique_key_fires_an_alert_once_under_concurrent_evaluations(db_url, conn, budgets, spender, receiver):
    _crossed(conn, spender, receiver.url, "10.00", cap="10.00")
    barrier = threading.Barrier(4)
    results: list[list] = []

    def evaluate_in_own_connection() -> None:
        with psycopg.connect(to_libpq_url(db_url), autocommit=True) as own:
            barrier.wait(10)
            results.append(_fired(own, budgets))

    threads = [threading.Thread(target=evaluate_in_own_connection) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    new = sorted((kind, threshold) for fired in results for kind, threshold, is_new, _ in fired if is_new)
    assert new == [("budget", "100"), ("budget", "50"), ("budget", "80")]  # each threshold new in one evaluation
    assert conn.execute("SELECT count(*) FROM alert_deliveries").fetchone()[0] == 3
    with pytest.raises(psycopg.errors.UniqueViolation):  # the key is PostgreSQL's, not only the code's
        conn.execute("INSERT INTO alerts (alert_id, customer_id, kind, threshold, period, fired_at, data) "
                     "VALUES ('other', 'acme', 'budget', '80', '2026-11', now(), '{}')")


def test_a_receiver_failing_twice_gets_the_alert_once_after_backoff(conn, budgets, spender, receivers, clock):
    receiver = receivers(fail_first=2)
    _crossed(conn, spender, receiver.url, "100.00")
    fired = evaluate(conn, now=NOW, defaults=Thresholds(budget_percents=(Decimal(100),), credit_percents=(),
                                                        forecast_overspend=False, credit_runout_days=0),
                     budgets=budgets)
    [delivery] = fired[0].deliveries
    attempts = deliver(conn, FAST, [delivery], clock=clock, sleep=clock.sleep)

    assert [(a.attempt, a.status, a.outcome) for a in attempts] == [
        (1, 500, "pending"), (2, 500, "pending"), (3, 200, "delivered")]
    assert clock.sleeps == [1.0, 2.0]  # base, then doubled
    assert receiver.answers() == [(500, "failing on purpose")] * 2 + [(200, "processed")]
    assert {r.delivery_id for r in receiver.requests} == {delivery}  # the same id on every attempt
    assert len({r.body for r in receiver.requests}) == 1 and json.loads(receiver.requests[0].body)["id"] == delivery
    stamps = [int(r.signature.split(",")[0].removeprefix("t=")) for r in receiver.requests]
    assert [b - a for a, b in zip(stamps, stamps[1:], strict=False)] == [1, 2]  # each attempt signed at its own time
    [shown] = store.alerts_for(conn, "acme")
    assert {k: shown["deliveries"][0][k] for k in ("status", "attempts", "last_status", "last_error",
                                                   "next_attempt_at")} == {
        "status": "delivered", "attempts": 3, "last_status": 200, "last_error": None, "next_attempt_at": None}
    assert deliver_due(conn, FAST, now=clock(), clock=clock) == []  # delivered: never sent again


def test_a_replayed_delivery_is_recognised_by_its_id(conn, budgets, spender, receiver, clock):
    """At least once: a sender that died after the POST and before its commit sends the attempt again;
    the documented receiver sees the same id and does not act twice."""
    _crossed(conn, spender, receiver.url, "50.00")
    [(_, _, _, _)] = _fired(conn, budgets)
    deliver(conn, FAST, _pending(conn), clock=clock, sleep=clock.sleep)
    conn.execute("UPDATE alert_deliveries SET status = 'pending', next_attempt_at = %s", (clock(),))  # the lost commit
    clock.sleep(2)
    deliver_due(conn, FAST, now=clock(), clock=clock)
    assert receiver.answers() == [(200, "processed"), (200, "duplicate")]
    first, again = receiver.requests
    assert first.delivery_id == again.delivery_id and first.body == again.body
    assert len(receiver.processed) == 1


def test_the_signature_verifies_with_the_documented_scheme(conn, budgets, spender, receiver, clock):
    _crossed(conn, spender, receiver.url, "50.00")
    _fired(conn, budgets)
    deliver(conn, FAST, _pending(conn), clock=clock, sleep=clock.sleep)
    [got] = receiver.requests
    assert got.status == 200  # the documented verify accepted it
    verify = docs_receiver()["verify"]
    t = int(got.signature.split(",")[0].removeprefix("t="))
    assert got.signature == signature_header(SECRET, t, got.body)
    assert verify(SECRET, got.signature, got.body, now=t + 300)
    assert not verify(SECRET, got.signature, got.body, now=t + 301)  # too old: a captured request replayed
    assert not verify(SECRET, got.signature, got.body.replace(b"50", b"51"), now=t)  # a changed body
    assert not verify("whsec_another_secret_000000", got.signature, got.body, now=t)
    assert verify(SECRET, f"t={t},v1=00,v1={got.signature.split('v1=')[1]}", got.body, now=t)  # a rotation's two v1


def test_a_delivery_that_fails_every_attempt_is_marked_failed(conn, budgets, spender, receivers, clock):
    _crossed(conn, spender, receivers(fail_first=100).url, "50.00")
    _fired(conn, budgets)
    attempts = deliver(conn, Policy(attempts=3, base_s=1.0, timeout_s=5.0), _pending(conn), clock=clock,
                       sleep=clock.sleep)
    assert [a.outcome for a in attempts] == ["pending", "pending", "failed"] and clock.sleeps == [1.0, 2.0]
    [shown] = store.alerts_for(conn, "acme")
    assert {k: shown["deliveries"][0][k] for k in ("status", "attempts", "last_status", "last_error")} == {
        "status": "failed", "attempts": 3, "last_status": 500, "last_error": "HTTP 500"}


def test_an_endpoint_that_does_not_answer_is_a_failed_attempt(conn, budgets, spender, receiver, clock):
    receiver.stop()  # nothing listens on its port any more
    _crossed(conn, spender, receiver.url, "50.00")
    _fired(conn, budgets)
    [attempt] = deliver_due(conn, FAST, now=clock(), clock=clock)
    assert attempt.status is None and attempt.outcome == "pending" and "Connection" in attempt.error


def test_an_endpoint_for_one_customer_gets_only_its_alerts(conn, budgets, spender, receiver, clock):
    store.set_endpoint(conn, receiver.url, secret=SECRET, customer_id="acme", now=NOW)
    spender.cap("acme", "100.00")
    spender.cap("globex", "100.00")
    spender.spend("acme", "50.00")
    spender.spend("globex", "50.00")
    assert sorted(_fired(conn, budgets)) == [("budget", "50", True, 0), ("budget", "50", True, 1)]
    deliver(conn, FAST, _pending(conn), clock=clock, sleep=clock.sleep)
    assert [b["alert"]["customer_id"] for b in _alert_bodies(receiver)] == ["acme"]


def test_a_customers_own_thresholds_replace_the_defaults(conn, budgets, spender):
    spender.cap("acme", "100.00")
    spender.spend("acme", "60.00")
    store.set_thresholds(conn, "acme", budget="25,60", now=NOW)
    assert _fired(conn, budgets) == [("budget", "25", True, 0), ("budget", "60", True, 0)]
    thresholds, source = store.thresholds_for(conn, "acme", BUDGET_ONLY)
    assert source["budget_percents"] == "customer" and source["credit_percents"] == "default"
    with pytest.raises(store.AlertError, match="two decimals"):
        store.set_thresholds(conn, "acme", budget="80.125", now=NOW)


def test_the_schedule_evaluates_and_sends(db_url, alert_settings, conn, spender, receiver):
    """`infermeter up`'s round: evaluate now, send what is due (signed now: the receiver accepts it)."""
    store.set_endpoint(conn, receiver.url, secret=SECRET, now=NOW)
    spender.cap("acme", "100.00")
    spender.spend("acme", "80.00", at=datetime.now(UTC))  # this month: the schedule evaluates now
    schedule = AlertSchedule(alert_settings, db_url)
    fired = schedule.evaluate_once()
    assert sorted((f.crossing.kind, f.crossing.threshold) for f in fired if f.new) == [
        ("budget", "50"), ("budget", "80")]
    assert receiver.answers() == [(200, "processed")] * 2
    again = schedule.evaluate_once()
    assert again and not [f for f in again if f.new] and len(receiver.requests) == 2
    assert schedule.rounds == 2


def test_a_budget_alert_fires_once_per_billing_period_in_the_customers_time_zone(conn, budgets, spender):
    """Budgets count the customer's billing period (Asia/Kolkata: December's starts 2026-11-30T18:30Z),
    so the budget alert is once per that period, labelled as billing labels it, not per UTC month."""
    from billing_service.customers import set_customer

    set_customer(conn, "kol", now=datetime(2026, 10, 1, tzinfo=UTC), timezone="Asia/Kolkata")
    spender.cap("kol", "100.00")

    def fired(at):
        return [(f.crossing.threshold, f.crossing.period, f.new)
                for f in evaluate(conn, now=at, defaults=BUDGET_ONLY, budgets=budgets, customer_ids=["kol"])]

    spender.spend("kol", "50.00", at=datetime(2026, 11, 30, 18, tzinfo=UTC))
    assert fired(datetime(2026, 11, 30, 18, 10, tzinfo=UTC)) == [("50", "2026-11", True)]
    spender.spend("kol", "50.00", at=datetime(2026, 11, 30, 18, 40, tzinfo=UTC))  # the new period's
    assert fired(datetime(2026, 11, 30, 19, tzinfo=UTC)) == [("50", "2026-12", True)]
    assert fired(datetime(2026, 12, 1, 0, 30, tzinfo=UTC)) == [("50", "2026-12", False)]  # the same period
