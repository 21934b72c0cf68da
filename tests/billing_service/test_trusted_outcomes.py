"""Who may report what (issue 10, item 9), against the real PostgreSQL: a per-task book that trusts a
verifier ignores the outcomes a customer reports itself, and bills a task with attempts but no trusted
outcome within the book's task_timeout by the book's rule, at the deadline. Rating, billing runs and
shadow rating all count tasks that way.

The month: customer acme (UTC) runs tasks in February 2026; a verifier (`//verifier/checks`, a producer
credential) reports some outcomes; the customer (`//customer/acme`, its own key) reports every task
failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from billing_service.customers import assign_plan, set_customer
from billing_service.invoices import show_invoice
from billing_service.run import billing_run
from infermeter.stack.postgres import to_libpq_url
from pricing.book import parse_price_book
from pricing_service.books import read_cost_model
from pricing_service.rate_period import rate_period
from pricing_service.shadow import shadow_rating_on
from tests.metering.conftest import retention_clock

COST = read_cost_model(None)
VERIFIER, CUSTOMER = "//verifier/checks", "//customer/acme"
FEB = (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
MAR = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))
TRUSTING_EVERYONE = """\
id: per-task-naive
currency: USD
charges:
  - meter: successful_tasks
    price: {type: unit, amount: "1.00", per: 1}
  - meter: failed_tasks
    price: {type: unit, amount: "0.10", per: 1}
  - meter: task_attempts
    price: {type: unit, amount: "0.01", per: 1}
"""
TRUSTED = TRUSTING_EVERYONE.replace("per-task-naive", "per-task-verified") + """\
task_outcomes:
  trusted_sources: ["//verifier/"]
  task_timeout: 24h
  untrusted_outcome: RULE
"""


def book(rule: str = "bill_as_success") -> str:
    return TRUSTED.replace("RULE", rule)


def at(day: int, hour: int = 10, month: int = 2) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


@pytest.fixture
def tasks(metering):
    """t1: two attempts, only the customer reports (failed) -> the rule, at Feb 4 10:00 (first request + 24 h).
    t2: the verifier says succeeded at 12:00, the customer failed later -> succeeded at Feb 5 12:00.
    t3: the verifier says failed, the customer succeeded -> failed at Feb 6 11:00.
    t4: the verifier's success comes after the deadline -> the rule, at Feb 8 10:00.
    t5: last request Feb 28 20:00, no outcome -> the rule at Mar 1 20:00: March's, not February's.
    t6: the customer reports on a task it never ran (no attempts) -> nothing."""
    m = metering
    m.request("acme", at(3), task_id="t1")
    m.request("acme", at(3, 11), task_id="t1", attempt=2)
    m.task("acme", "t1", "failed", at(3, 12), source=CUSTOMER)
    m.request("acme", at(5), task_id="t2")
    m.task("acme", "t2", "succeeded", at(5, 12), source=VERIFIER)
    m.task("acme", "t2", "failed", at(5, 13), source=CUSTOMER)
    m.request("acme", at(6), task_id="t3")
    m.task("acme", "t3", "failed", at(6, 11), source=VERIFIER)
    m.task("acme", "t3", "succeeded", at(6, 12), source=CUSTOMER)
    m.request("acme", at(7), task_id="t4")
    m.task("acme", "t4", "failed", at(7, 11), source=CUSTOMER)
    m.task("acme", "t4", "succeeded", at(9), source=VERIFIER)
    m.request("acme", at(28, 20), task_id="t5")
    m.task("acme", "t6", "failed", at(10), source=CUSTOMER)
    return m


def task_quantities(rating) -> dict[str, Decimal]:
    return {line.meter: line.quantity for line in rating.lines}


@pytest.mark.parametrize(
    "rule, february, march",
    [
        # t1 and t4 by the rule; t2 and t3 as the verifier said; t5 in March
        ("bill_as_success", {"successful_tasks": 3, "failed_tasks": 1, "task_attempts": 5},
         {"successful_tasks": 1, "task_attempts": 1}),
        ("bill_as_failure", {"successful_tasks": 1, "failed_tasks": 3, "task_attempts": 5},
         {"failed_tasks": 1, "task_attempts": 1}),
        ("not_billed", {"successful_tasks": 1, "failed_tasks": 1, "task_attempts": 2}, {}),
    ],
)
def test_a_per_task_book_ignores_untrusted_outcomes_and_bills_timeouts_by_its_rule(conn, tasks, rule, february,
                                                                                    march):
    trusted = parse_price_book(book(rule))
    assert task_quantities(rate_period(conn, trusted, *FEB)["acme"]) == february
    rated_march = rate_period(conn, trusted, *MAR).get("acme")
    assert (task_quantities(rated_march) if rated_march else {}) == march
    # a book trusting everyone counts the latest outcome of each task, whoever sent it: t1, t2 and t6 (no
    # attempts) failed, t3 and t4 succeeded
    naive = task_quantities(rate_period(conn, parse_price_book(TRUSTING_EVERYONE), *FEB)["acme"])
    assert naive == {"successful_tasks": 2, "failed_tasks": 3, "task_attempts": 5}


def test_the_invoice_bills_trusted_outcomes_and_the_customer_cannot_lower_it(conn, tasks):
    set_customer(conn, "acme", now=at(1, 0, month=1))
    assign_plan(conn, "acme", book("bill_as_success"), "per-task-verified.yaml", "2026-02-01", now=at(1, 0, month=1))
    [draft] = billing_run(conn, "2026-02", now=at(20), cost_model=COST).invoices
    # period to date (Feb 20): t1, t2, t4 succeeded, t3 failed; 5 attempts
    assert draft.total == Decimal("3.00") + Decimal("0.10") + Decimal("0.05")
    lines = {(x["meter"], x["quantity"], x["amount"]) for x in show_invoice(conn, draft.invoice_id)["lines"]}
    assert lines == {("successful_tasks", "3", "3.00"), ("failed_tasks", "1", "0.10"), ("task_attempts", "5", "0.05")}

    # the customer marks every task failed again, later: the invoice does not move
    for task_id in ("t1", "t2", "t4", "t5"):
        tasks.task("acme", task_id, "failed", at(21), source=CUSTOMER, event_id=f"{task_id}/again")
    [again] = billing_run(conn, "2026-02", now=at(22), cost_model=COST).invoices
    assert (again.invoice_id, again.total) == (draft.invoice_id, draft.total)
    assert show_invoice(conn, again.invoice_id)["lines"] == show_invoice(conn, draft.invoice_id)["lines"]

    # a trusted verifier outcome does count: t1 failed within its deadline
    tasks.task("acme", "t1", "failed", at(4, 9), source=VERIFIER)
    [refreshed] = billing_run(conn, "2026-02", now=at(22, 12), cost_model=COST).invoices
    assert refreshed.total == Decimal("2.00") + Decimal("0.20") + Decimal("0.05")

    # finalized after the grace window: March bills t5 (deadline Mar 1 20:00) by the rule
    billing_run(conn, "2026-02", now=datetime(2026, 3, 2, 1, tzinfo=UTC), cost_model=COST)
    [mar] = [o for o in billing_run(conn, "2026-03", now=datetime(2026, 3, 20, tzinfo=UTC), cost_model=COST).invoices
             if o.period == "2026-03"]
    assert mar.total == Decimal("1.00") + Decimal("0.01")


def test_shadow_rating_counts_tasks_per_book(conn, tasks):
    books = [parse_price_book(TRUSTING_EVERYONE), parse_price_book(book("bill_as_success"))]
    report = shadow_rating_on(conn, books, COST, now=at(27), customer_id="acme")
    revenue = {line.book_id: line.revenue_to_date for line in report.lines}
    # everyone's word: t3, t4 succeeded, t1, t2, t6 failed, 5 attempts -> 2.35; trusted: 3 succeeded,
    # 1 failed, 5 attempts -> 3.15
    assert revenue == {"per-task-naive": Decimal("2.35"), "per-task-verified": Decimal("3.15")}


def test_only_the_window_of_the_deadline_bills_a_timed_out_task(conn, metering):
    """A task whose first request is at 23:30 and no trusted outcome: billed once, in the window that
    holds first request + timeout, whatever the windows."""
    metering.request("acme", datetime(2026, 2, 10, 23, 30, tzinfo=UTC), task_id="late")
    trusted = parse_price_book(book("bill_as_success").replace("24h", "90m"))
    start = datetime(2026, 2, 10, 20, tzinfo=UTC)
    hours = [rate_period(conn, trusted, start + timedelta(hours=i), start + timedelta(hours=i + 1)).get("acme")
             for i in range(8)]
    counted = [i for i, r in enumerate(hours) if r and task_quantities(r).get("successful_tasks")]
    assert counted == [5]  # [01:00, 02:00): 23:30 + 90 min = 01:00


def test_pricing_compare_rates_each_book_with_its_own_trust(db_url, tasks, tmp_path):
    from pricing_service.compare import run_comparison

    naive, trusted = tmp_path / "naive.yaml", tmp_path / "verified.yaml"
    naive.write_text(TRUSTING_EVERYONE)
    trusted.write_text(book("bill_as_success"))
    report = run_comparison(db_url, *FEB, [naive, trusted]).comparison
    assert [(b.book.id, b.revenue) for b in report.books] == [
        ("per-task-naive", Decimal("2.35")), ("per-task-verified", Decimal("3.15"))]
    # the risk buckets (days) add up to each book's revenue: the trusted book's tasks sit on their days
    for b in report.books:
        assert sum((x.revenue for x in b.risk.buckets), Decimal(0)) == b.revenue
    by_day = {x.start.day: x.revenue for x in report.books[1].risk.buckets if x.revenue}
    # a task counts (with its attempts) on the day of its billed time: t1 and t4 at their deadlines
    assert by_day == {4: Decimal("1.02"), 5: Decimal("1.01"), 6: Decimal("0.11"), 8: Decimal("1.01")}


def test_metering_reconciles_every_outcome_report_with_the_raw_events(conn, tasks):
    from metering.queries import Window
    from metering.reconcile import reconcile

    result = reconcile(conn, Window(*FEB))
    assert result.ok, result.differences
    assert {k: v for k, v in result.totals.items() if k.startswith("task_reports:")} == {
        "task_reports:failed": 5, "task_reports:succeeded": 3}
    conn.execute("DELETE FROM task_outcome_reports WHERE source = %s AND task_id = 't2'", (VERIFIER,))
    assert [(d.meter, d.raw, d.rollup) for d in reconcile(conn, Window(*FEB)).differences] == [
        ("task_reports:succeeded", 3, 2)]


def _metered(settings, keys: list[tuple[str, str]]) -> None:
    """Run the real metering consumer until these (source, id) events are recorded."""
    import time

    from metering.consumer import MeteringConsumer, run_in_thread
    from metering.event_lookups import recorded_event_keys

    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap, retention_clock=retention_clock)
    thread = run_in_thread(consumer)
    try:
        with psycopg.connect(to_libpq_url(settings.database_url), autocommit=True) as c:
            until = time.monotonic() + 120
            while time.monotonic() < until and recorded_event_keys(c, keys) != set(keys):
                time.sleep(0.2)
            assert recorded_event_keys(c, keys) == set(keys)
    finally:
        consumer.stop()
        thread.join(30)


def test_over_http_a_customer_cannot_lower_its_per_task_invoice_and_a_verifier_can_change_it(
    conn, tasks, settings
):
    """The whole path over HTTP: the customer's key posts outcomes to POST /v1/events (its own source
    only; a verifier's source is refused), metering records them, and the customer's own invoice
    preview (GET /v1/invoices/preview) does not move; the verifier's report (producer credential) does."""
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine

    from app.api import create_app
    from metering.contract import encode_event, task_event
    from metering.kafka import ensure_topics
    from serving.keys import KeyStore

    set_customer(conn, "acme", now=at(1, 0, month=1))
    assign_plan(conn, "acme", book("bill_as_success"), "per-task-verified.yaml", "2026-02-01", now=at(1, 0, month=1))
    ensure_topics(settings.kafka_bootstrap, settings)
    _, key = KeyStore(create_engine(settings.database_url), settings=settings).create("acme")

    def outcome(task_id: str, outcome: str, finished: datetime, source: str, event_id: str) -> bytes:
        return encode_event(task_event(source=source, customer_id="acme", task_id=task_id, outcome=outcome,
                                       finished_at=finished, event_id=event_id))

    cloudevent = {"Content-Type": "application/cloudevents+json"}
    customer = {"Authorization": f"Bearer {key}", **cloudevent}
    app = create_app(settings, settings.database_url, settings.kafka_bootstrap, clock=lambda: at(20))
    with TestClient(app) as client:
        def preview() -> str:
            answer = client.get("/v1/invoices/preview", params={"period": "2026-02"}, headers=customer)
            assert answer.status_code == 200, answer.text
            return answer.json()["total"]

        assert preview() == "3.15"
        spoof = client.post("/v1/events", content=outcome("t2", "failed", at(5, 14), VERIFIER, "spoof"),
                            headers=customer)
        assert spoof.status_code == 403 and spoof.json()["error"]["code"] == "forbidden"
        own = client.post("/v1/events", content=outcome("t2", "failed", at(5, 14), CUSTOMER, "own"), headers=customer)
        assert own.status_code == 202, own.text
        _metered(settings, [(CUSTOMER, "own")])
        assert preview() == "3.15"  # the customer's word does not count under this book

        verified = client.post("/v1/events", content=outcome("t1", "failed", at(4, 9), VERIFIER, "v-t1"),
                               headers={"Authorization": f"Bearer {settings.producer_token}", **cloudevent})
        assert verified.status_code == 202, verified.text
        _metered(settings, [(VERIFIER, "v-t1")])
        assert preview() == "2.25"  # t1 failed by the verifier, within its deadline
    assert conn.execute("SELECT count(*) FROM event_keys WHERE event_id = 'spoof'").fetchone() == (0,)


def test_unbilled_usage_counts_every_source_and_labels_what_the_customer_reported_itself(conn, tasks, metering):
    """No plan, so no book and no trusted sources: the billing run's unbilled usage counts tasks as a
    book trusting everyone would (its task meters equal that book's rating), and labels what rests on the
    customer's own word, abandoned tasks (no task meter counts them) and tasks with no outcome yet."""
    tasks.request("acme", at(12), task_id="t7")
    tasks.task("acme", "t7", "abandoned", at(12, 11), source=CUSTOMER)  # hidden from a book trusting everyone
    metering.request("ghost", at(14), task_id="g1")  # no customer record: the UTC period
    metering.task("ghost", "g1", "abandoned", at(14, 1), source="//customer/ghost")
    set_customer(conn, "acme", now=at(1, 0, month=1))  # a record, no plan
    result = billing_run(conn, "2026-02", now=at(1, 0, month=3), cost_model=COST)
    unbilled = {u.customer_id: u for u in result.unbilled}
    assert unbilled["acme"].reason.startswith("no plan")
    acme = {k: v for k, v in unbilled["acme"].quantities.items() if "tasks" in k or "attempts" in k}
    # latest outcome from anyone: t3, t4 succeeded; t1, t2 (the customer's later report), t6 failed; t7 abandoned
    assert acme == {
        "successful_tasks": "2", "successful_tasks[self_reported]": "1",  # t3: the customer overrode the verifier
        "failed_tasks": "3", "failed_tasks[self_reported]": "3",
        "abandoned_tasks": "1", "abandoned_tasks[self_reported]": "1",
        "task_attempts": "5",  # of the successful and failed tasks, as rating counts them
        "tasks_without_outcome": "1",  # t5
    }
    naive = task_quantities(rate_period(conn, parse_price_book(TRUSTING_EVERYONE), *FEB)["acme"])
    assert {m: str(q) for m, q in naive.items()} == {m: acme[m] for m in naive}
    assert unbilled["ghost"].reason.startswith("no customer record")
    assert {k: v for k, v in unbilled["ghost"].quantities.items() if "tasks" in k} == {
        "abandoned_tasks": "1", "abandoned_tasks[self_reported]": "1"}
    # a plan from March leaves February unbilled, March billed: nothing for acme in March's report
    assign_plan(conn, "acme", book("bill_as_success"), "per-task-verified.yaml", "2026-03-01", now=at(1, 0, month=3))
    march = billing_run(conn, "2026-03", now=datetime(2026, 3, 20, tzinfo=UTC), cost_model=COST)
    assert "acme" not in {u.customer_id for u in march.unbilled}
