"""Budgets: reservations shared through Postgres, settlement, no double counting with metering."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy import func, select

from infermeter.stack.postgres import to_libpq_url
from infermeter.times import Window
from metering.contract import REQUEST_V1, encode_event, make_event
from metering.kafka_types import Message
from metering.writer import BatchWriter
from serving.budgets import (
    WARNING_HEADER,
    AdmissionController,
    Admitted,
    Rejected,
    list_price,
    metered_cost,
    set_budget,
)
from serving.tables import budget_reservations

NOW = datetime(2026, 11, 15, 12, 0, 30, tzinfo=UTC)
# List prices of these tests: 1.00 per 1M input tokens, 0.50 cached, 2.00 output.
PRICES = dict(
    list_price_input_per_mtok="1.00", list_price_cached_input_per_mtok="0.50", list_price_output_per_mtok="2.00"
)
PROMPT, MAX_TOKENS = 1000, 500
WORST = Decimal("0.002")  # 1000 x 0.000001 + 500 x 0.000002


@pytest.fixture
def budget_settings(settings):
    return settings.model_copy(update=PRICES)


def controller(engine, budget_settings, now=NOW) -> AdmissionController:
    return AdmissionController(engine, budget_settings, clock=lambda: now)


def admit(ctl, customer, request_id=None, now=NOW, prompt=PROMPT, max_tokens=MAX_TOKENS):
    return ctl.admit_sync(customer, model="tiny", request_id=request_id or uuid.uuid4().hex,
                          prompt_tokens=prompt, max_tokens=max_tokens, now=now)


def test_list_price_is_exact_decimal(budget_settings):
    price = list_price("tiny", budget_settings)
    assert price.cost(uncached_input_tokens=PROMPT, cached_input_tokens=0, output_tokens=MAX_TOKENS) == WORST
    assert isinstance(price.output, Decimal)


def test_metered_cost_without_a_book_is_the_setting_prices_exactly(budget_settings):
    month = Window.month_of(NOW)
    sums = {("tiny", "dep"): (PROMPT, 200, MAX_TOKENS), ("other", "dep"): (1, 0, 0)}
    assert metered_cost("c", month, sums, budget_settings) == WORST + Decimal("0.0001") + Decimal("0.000001")


def test_customer_without_budget_is_admitted_without_a_reservation(engine, budget_settings):
    ctl = controller(engine, budget_settings)
    result = admit(ctl, "free-cust", "r1")
    assert isinstance(result, Admitted) and not result.limited
    assert ctl.settle_sync("r1", input_tokens=5, cached_input_tokens=0, output_tokens=5,
                           event_source="s", event_id="r1") is None


def test_a_customer_without_limits_in_use_is_checked_again_before_its_entry_expires(engine, budget_settings):
    """Known to have no budget: admitted from memory. In the last quarter of the entry's lifetime the
    request is still admitted from memory and the check runs again in the background; a budget set
    meanwhile is found by it, and the next request takes a reservation."""
    ctl = controller(engine, budget_settings)
    assert not admit(ctl, "later-limited", "r1").limited  # now known to have no budget row
    set_budget(engine, "later-limited", monthly_cap=Decimal("10"))
    ttl = budget_settings.budget_config_ttl_s
    ctl._unlimited["later-limited"] = time.monotonic() + ttl * 0.1  # due for the background check

    async def near_expiry() -> Admitted:
        result = await ctl.admit("later-limited", model="tiny", request_id="r2", prompt_tokens=PROMPT,
                                 max_tokens=MAX_TOKENS)
        for _ in range(500):
            if "later-limited" not in ctl._unlimited:
                break
            await asyncio.sleep(0.01)
        return result

    assert not asyncio.run(near_expiry()).limited  # within the TTL: still from memory
    assert "later-limited" not in ctl._unlimited  # the background check found the budget
    assert admit(ctl, "later-limited", "r3").limited


def test_requests_finding_an_unlimited_customers_entry_expired_wait_for_one_check(engine, budget_settings):
    """A customer known to have no limits, idle past its entry's lifetime: the requests that arrive
    then share one check (no admission transaction each), and are admitted without a reservation;
    a budget set meanwhile is found by that check, and they take reservations."""
    ctl = controller(engine, budget_settings)
    assert not admit(ctl, "idle-free", "r0").limited
    assert not admit(ctl, "idle-limited", "s0").limited
    set_budget(engine, "idle-limited", monthly_cap=Decimal("10"))
    checks: list[str] = []
    transactions: list[str] = []
    check, admit_sync = ctl._check_unlimited, ctl.admit_sync

    def counted_check(customer):
        checks.append(customer)
        return check(customer)

    def counted_transaction(customer, **kwargs):
        transactions.append(customer)
        return admit_sync(customer, now=NOW, **kwargs)

    ctl._check_unlimited, ctl.admit_sync = counted_check, counted_transaction
    for customer in ("idle-free", "idle-limited"):
        ctl._unlimited[customer] = time.monotonic() - 0.01  # expired

    async def burst(customer: str) -> list:
        return await asyncio.gather(*(
            ctl.admit(customer, model="tiny", request_id=f"{customer}-{i}", prompt_tokens=PROMPT,
                      max_tokens=MAX_TOKENS) for i in range(10)
        ))  # fmt: skip

    free = asyncio.run(burst("idle-free"))
    assert all(isinstance(r, Admitted) and not r.limited for r in free)
    assert checks == ["idle-free"] and transactions == []
    limited = asyncio.run(burst("idle-limited"))
    assert all(isinstance(r, Admitted) and r.limited for r in limited)
    assert checks == ["idle-free", "idle-limited"] and transactions == ["idle-limited"] * 10
    assert ctl.spend("idle-limited", now=NOW).reserved == WORST * 10


def test_the_key_lookup_primes_whether_the_customer_has_limits(engine, budget_settings):
    """The API key's lookup reads whether its customer has a budget row in the same statement: a
    customer without one is admitted from memory with no check of admission's own, and a budget
    found by a later lookup takes the customer off the memory path."""
    from serving.keys import KeyStore

    ctl = controller(engine, budget_settings)
    checks: list[str] = []
    check = ctl._check_unlimited

    def counted_check(customer):
        checks.append(customer)
        return check(customer)

    ctl._check_unlimited = counted_check
    store = KeyStore(engine, budget_settings)
    store.admission = ctl
    _, token = store.create("primed-cust")
    store.authenticate_sync(token)
    assert ctl._known_unlimited("primed-cust")
    result = asyncio.run(ctl.admit("primed-cust", model="tiny", request_id="p1", prompt_tokens=PROMPT,
                                   max_tokens=MAX_TOKENS))  # fmt: skip
    assert isinstance(result, Admitted) and not result.limited and checks == []
    set_budget(engine, "primed-cust", monthly_cap=Decimal("10"))
    store._cache.clear()
    store.authenticate_sync(token)
    assert not ctl._known_unlimited("primed-cust")
    assert admit(ctl, "primed-cust", "p2").limited


def test_100_concurrent_requests_on_two_gateways_overshoot_at_most_one_worst_case(engine, other_engine, budget_settings):
    cap = Decimal("0.05")  # room for exactly 25 worst cases
    set_budget(engine, "cust-a", monthly_cap=cap, mode="hard")
    gateways = [controller(engine, budget_settings), controller(other_engine, budget_settings)]
    results: list[Admitted | Rejected] = []
    lock = threading.Lock()
    barrier = threading.Barrier(100)

    def one(i: int) -> None:
        barrier.wait()
        outcome = admit(gateways[i % 2], "cust-a", f"req-{i}")
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    admitted = [r for r in results if isinstance(r, Admitted)]
    rejected = [r for r in results if isinstance(r, Rejected)]
    assert len(results) == 100
    spend = gateways[0].spend("cust-a", now=NOW)
    assert spend.reserved == WORST * len(admitted)
    assert spend.total <= cap + WORST  # the requirement
    assert len(admitted) == 25  # in fact: no overshoot at all
    assert {r.reason for r in rejected} == {"budget_exceeded"}
    assert {(r.status, r.error_type, r.code) for r in rejected} == {(402, "insufficient_quota", "budget_exceeded")}
    body = rejected[0].openai_error()
    assert set(body["error"]) == {"message", "type", "param", "code"} and "budget" in body["error"]["message"]

    # settling to the actual cost releases the difference: room for more requests
    for a in admitted:
        actual = gateways[1].settle_sync(a.request_id, input_tokens=PROMPT, cached_input_tokens=0, output_tokens=100,
                                         event_source="//gateway/t", event_id=a.request_id)
        assert actual == Decimal("0.0012")
    spend = gateways[0].spend("cust-a", now=NOW)
    assert (spend.reserved, spend.settled_unmetered) == (0, Decimal("0.0012") * 25)
    more = [admit(gateways[0], "cust-a") for _ in range(12)]
    assert sum(isinstance(r, Admitted) for r in more) == 10  # (0.05 - 0.03) / 0.002


def test_settled_cost_moves_to_metered_without_double_counting(engine, db_url, budget_settings, settings):
    set_budget(engine, "cust-m", monthly_cap=Decimal("10"), mode="hard")
    ctl = controller(engine, budget_settings, now=datetime.now(UTC))
    started = datetime.now(UTC)
    result = ctl.admit_sync("cust-m", model="tiny", request_id="req-m1", prompt_tokens=PROMPT, max_tokens=MAX_TOKENS)
    assert isinstance(result, Admitted) and result.limited
    assert ctl.spend("cust-m").reserved == WORST
    event = make_event(REQUEST_V1, source="//gateway/gw-1", subject="cust-m", event_id="req-m1", data={
        "request_id": "req-m1", "customer_id": "cust-m", "api_key_id": "k", "model": "tiny",
        "deployment_id": "dep", "replica_id": "r0", "status": "ok", "input_tokens": PROMPT,
        "cached_input_tokens": 200, "output_tokens": 100, "task_id": None, "attempt": 1,
        "started_at": started, "first_token_at": started, "finished_at": started, "tags": {}})
    actual = ctl.settle_sync("req-m1", input_tokens=PROMPT, cached_input_tokens=200, output_tokens=100,
                             event_source=event["source"], event_id=event["id"])
    assert actual == Decimal("0.0008") + Decimal("0.0001") + Decimal("0.0002")
    before = ctl.spend("cust-m")
    assert (before.metered, before.settled_unmetered, before.reserved) == (0, actual, 0)
    # the real metering write path ingests the event (rollup + event_keys in one transaction)
    writer = BatchWriter(to_libpq_url(db_url), group_id="g", max_bytes=65536, future_tolerance_s=300)
    raw = encode_event(event)
    for offset in (0, 1):  # ingested twice (a duplicate on the topic): still counted once
        writer.write([Message("t", 0, offset, b"cust-m", raw, {}, None)])
    writer.close()
    after = ctl.spend("cust-m")
    assert (after.metered, after.settled_unmetered, after.reserved) == (actual, 0, 0)
    assert after.total == before.total
    ctl.housekeep("cust-m")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(budget_reservations)).scalar() == 0
    assert ctl.spend("cust-m").total == actual


def test_soft_mode_admits_with_a_warning_header(engine, budget_settings):
    set_budget(engine, "cust-s", monthly_cap=Decimal("0.003"), mode="soft")
    ctl = controller(engine, budget_settings)
    first, second = admit(ctl, "cust-s"), admit(ctl, "cust-s")
    assert isinstance(first, Admitted) and first.warning is None and first.headers == {}
    assert isinstance(second, Admitted) and WARNING_HEADER in second.headers
    assert "monthly budget exceeded" in second.headers[WARNING_HEADER]
    assert ctl.spend("cust-s", now=NOW).reserved == 2 * WORST  # still reserved: spend stays true


def test_expired_reservations_stop_counting(engine, budget_settings):
    set_budget(engine, "cust-x", monthly_cap=Decimal("0.002"), mode="hard")
    ctl = controller(engine, budget_settings)
    assert isinstance(admit(ctl, "cust-x"), Admitted)
    assert isinstance(admit(ctl, "cust-x"), Rejected)
    later = NOW + timedelta(seconds=budget_settings.reservation_ttl_s + 1)
    assert isinstance(admit(ctl, "cust-x", now=later), Admitted)  # the dead gateway's hold expired


def test_last_months_usage_does_not_count(engine, budget_settings):
    set_budget(engine, "cust-p", monthly_cap=Decimal("0.003"), mode="hard")
    ctl = controller(engine, budget_settings)
    a = admit(ctl, "cust-p", "old", now=datetime(2026, 10, 31, 23, 59, tzinfo=UTC))
    ctl.settle_sync(a.request_id, input_tokens=PROMPT, cached_input_tokens=0, output_tokens=MAX_TOKENS,
                    event_source="s", event_id="old", now=datetime(2026, 10, 31, 23, 59, 30, tzinfo=UTC))
    assert ctl.spend("cust-p", now=NOW).total == 0
    assert isinstance(admit(ctl, "cust-p"), Admitted)


def test_list_price_from_a_price_book_per_model_with_fallback(settings, tmp_path):
    book = tmp_path / "book.yaml"
    book.write_text(
        "id: lp\ncurrency: USD\ncharges:\n"
        "  - meter: output_tokens\n    price: {type: unit, amount: \"7.00\", per: 1000000}\n"
        "  - meter: output_tokens\n    model: lite\n    price: {type: unit, amount: \"3.50\", per: 1000000}\n"
        "  - meter: uncached_input_tokens\n    price: {type: tiered_volume, tiers: [{up_to: null, amount: \"1\"}]}\n"
    )
    s = settings.model_copy(update={**PRICES, "list_price_book": book})
    big, lite = list_price("big", s), list_price("lite", s)
    assert (big.output, lite.output) == (Decimal("0.000007"), Decimal("0.0000035"))
    assert big.uncached_input == Decimal("0.000001")  # not a unit price in the book: the setting
    assert big.cached_input == Decimal("0.0000005")


def test_async_admit_and_settle_from_100_tasks(engine, other_engine, budget_settings):
    """The gateway's path: 100 asyncio tasks on two controllers (worker threads, two pools)."""
    import asyncio

    set_budget(engine, "cust-async", monthly_cap=Decimal("0.02"), mode="hard")  # 10 worst cases
    gateways = [controller(engine, budget_settings), controller(other_engine, budget_settings)]

    async def one(i: int):
        result = await gateways[i % 2].admit("cust-async", model="tiny", request_id=f"a{i}",
                                             prompt_tokens=PROMPT, max_tokens=MAX_TOKENS)
        if isinstance(result, Admitted):
            await asyncio.sleep(0.01)  # the request runs
            await gateways[(i + 1) % 2].settle(f"a{i}", input_tokens=PROMPT, cached_input_tokens=0,
                                               output_tokens=MAX_TOKENS, event_source="s", event_id=f"a{i}")
        return result

    async def main():
        return await asyncio.gather(*(one(i) for i in range(100)))

    results = asyncio.run(main())
    admitted = [r for r in results if isinstance(r, Admitted)]
    assert len(admitted) == 10  # settled at exactly the worst case: nothing released
    assert gateways[0].spend("cust-async", now=NOW).total == Decimal("0.02")
    # a customer without a budget: answered from the cache, no reservation
    assert not asyncio.run(gateways[0].admit("nobody", model="tiny", request_id="n", prompt_tokens=1,
                                              max_tokens=1)).limited
    for g in gateways:
        g.close()


FREE_TIER_BOOK = """
id: list-free
currency: USD
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "1.00", per: 1000000}
    free: 1500000               # per month and model line
  - meter: cached_input_tokens
    price: {type: tiered_graduated, per: 1000000, tiers: [{up_to: 1000000, amount: "0.50"}, {up_to: null, amount: "0.25"}]}
  - meter: output_tokens
    price: {type: unit, amount: "3.00", per: 1000000}
    free: 100000
  - meter: output_tokens
    model: lite
    price: {type: unit, amount: "1.00", per: 3000000}
"""


def test_budget_spend_and_the_invoice_agree_to_the_cent_with_free_allowances(engine, db_url, budget_settings, tmp_path):
    """Budgets price metered usage through the invoice path (pricing.rating.rate): free allowances,
    tiers, one rounding per line. The same month rated by pricing_service.rate_period gives the
    same usage total, to the cent."""
    from pricing.book import parse_price_book
    from pricing_service.rate_period import rate_period
    from pricing_service.source import connect

    path = tmp_path / "list.yaml"
    path.write_text(FREE_TIER_BOOK)
    s = budget_settings.model_copy(update={"list_price_book": path})
    book = parse_price_book(FREE_TIER_BOOK)
    month = Window.month_of(NOW)
    rows = [  # customer, model, deployment, hour, input, cached, output
        ("cust-f", "big", "dep-a", month.start, 1_000_000, 400_000, 70_000),
        ("cust-f", "big", "dep-b", month.start + timedelta(hours=5), 1_234_567, 987_654, 123_457),
        ("cust-f", "lite", "dep-a", month.start + timedelta(days=3), 2_000_001, 1, 4_000_003),
        ("cust-f", "big", "dep-a", month.start - timedelta(hours=1), 9_000_000, 0, 9_000_000),  # last month
        ("cust-g", "big", "dep-a", month.start, 5_000_000, 0, 5_000_000),  # someone else
    ]
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        conn.cursor().executemany(
            "INSERT INTO request_rollup_hourly (customer_id, model, deployment_id, hour, requests, requests_ok, "
            "input_tokens, cached_input_tokens, output_tokens) VALUES (%s, %s, %s, %s, 1, 1, %s, %s, %s)", rows)
        # and the period totals metering keeps beside them (these customers have no calendar: UTC months)
        conn.cursor().executemany(
            "INSERT INTO request_period_totals (customer_id, model, deployment_id, period_start, requests, "
            "requests_ok, input_tokens, cached_input_tokens, output_tokens) "
            "VALUES (%s, %s, %s, date_trunc('month', %s AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 1, 1, %s, %s, %s)",
            rows)
    spend = controller(engine, s).spend("cust-f", now=NOW)
    with connect(db_url) as conn:
        invoice = rate_period(conn, book, month.start, month.end)["cust-f"]
    assert spend.metered == invoice.usage_total
    # by hand, one line per charge and model, each rounded once:
    # big  uncached 600_000 + 246_913 = 846_913, all inside the 1.5M free      -> 0.00
    # big  cached 1_387_654: 1M x 0.50/M + 387_654 x 0.25/M = 0.5969135       -> 0.60
    # big  output 193_457 - 100_000 free = 93_457 x 3.00/M = 0.280371         -> 0.28
    # lite uncached 2_000_000 - 1.5M free = 500_000 x 1.00/M                  -> 0.50
    # lite cached 1 x 0.50/M                                                  -> 0.00
    # lite output 4_000_003 x 1.00 / 3M = 1.333334...                         -> 1.33
    assert spend.metered == Decimal("2.71")
    # what pricing every token at the per-token list price (no free allowance) gave before
    per_token = sum((list_price(m, s).cost(uncached_input_tokens=i - c, cached_input_tokens=c, output_tokens=o)
                     for _, m, _, h, i, c, o in rows[:3]), Decimal(0))
    assert per_token > Decimal("4")
