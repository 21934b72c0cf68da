"""Budgets count the customer's billing period in its own time zone and anchor day (the calendar billing
hands metering), and the UTC calendar month for a customer without one. Usage goes through the real
metering writer; calendars are set the way billing sets them; clocks are injected."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy import select

from billing_service.customers import set_customer
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import Window
from metering.contract import REQUEST_V1, encode_event, make_event
from metering.kafka_types import Message
from metering.writer import BatchWriter
from serving.budgets import WARNING_HEADER, AdmissionController, Admitted, Rejected, set_budget
from serving.tables import budget_reservations

# List prices of these tests: 1.00 per 1M input tokens, 0.50 cached, 2.00 output.
PRICES = dict(
    list_price_input_per_mtok="1.00", list_price_cached_input_per_mtok="0.50", list_price_output_per_mtok="2.00"
)
PROMPT, MAX_TOKENS = 1000, 500
WORST = Decimal("0.002")  # 1000 x 0.000001 + 500 x 0.000002
MICRO = timedelta(microseconds=1)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.fixture
def budget_settings(settings):
    return settings.model_copy(update=PRICES)


@pytest.fixture
def ingest(db_url):
    """ingest(customer, at, input_tokens, output_tokens): one request event through the metering writer."""
    writer = BatchWriter(to_libpq_url(db_url), group_id=f"g-{uuid.uuid4().hex}", max_bytes=65536,
                         future_tolerance_s=300)
    offsets = iter(range(1_000_000))

    def one(customer: str, at: datetime, input_tokens: int, output_tokens: int) -> str:
        event_id = uuid.uuid4().hex
        event = make_event(REQUEST_V1, source="//gateway/gw-1", subject=customer, event_id=event_id, time=at, data={
            "request_id": event_id, "customer_id": customer, "api_key_id": "k", "model": "tiny",
            "deployment_id": "dep", "replica_id": "r0", "status": "ok", "input_tokens": input_tokens,
            "cached_input_tokens": 0, "output_tokens": output_tokens, "task_id": None, "attempt": 1,
            "started_at": at, "first_token_at": at, "finished_at": at, "tags": {}})
        result = writer.write([Message("t", 0, next(offsets), customer.encode(), encode_event(event), {}, None)])
        assert result.accepted == 1
        return event_id

    yield one
    writer.close()


@pytest.fixture
def calendar(db_url):
    """calendar(customer, timezone, anchor_day): the customer's billing record, as billing sets it (its
    calendar handed to metering in the same transaction)."""
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        def one(customer: str, timezone: str = "UTC", anchor_day: int = 1) -> None:
            set_customer(conn, customer, now=utc(2026, 10, 1), timezone=timezone, anchor_day=anchor_day)

        yield one


def output_cost(tokens: int) -> Decimal:
    return Decimal(2) * tokens / 1_000_000


def admit(ctl, customer, now, prompt=PROMPT, max_tokens=MAX_TOKENS):
    return ctl.admit_sync(customer, model="tiny", request_id=uuid.uuid4().hex, prompt_tokens=prompt,
                          max_tokens=max_tokens, now=now)


def test_kolkata_period_starts_at_1830_utc_and_the_boundary_instant_is_the_new_periods(
        engine, budget_settings, ingest, calendar):
    """Asia/Kolkata (+05:30), anchor day 1: December's period starts at 2026-12-01 00:00 local =
    2026-11-30T18:30Z, inside a UTC hour. Usage at 18:00Z is November's, usage at 18:30Z December's;
    the instant before the boundary sees the old period (at its cap: refused), the boundary instant
    the new one (admitted up to exactly the cap, then refused)."""
    boundary = utc(2026, 11, 30, 18, 30)
    calendar("kol", "Asia/Kolkata")
    set_budget(engine, "kol", monthly_cap=WORST, mode="hard")
    ingest("kol", utc(2026, 11, 30, 18, 0), PROMPT, MAX_TOKENS)  # costs WORST: November's period is at its cap
    ingest("kol", boundary, 500, 0)  # 0.0005, December's
    ctl = AdmissionController(engine, budget_settings)

    before = ctl.spend("kol", now=boundary - MICRO)
    assert before.period == Window(utc(2026, 10, 31, 18, 30), boundary)
    assert (before.metered, before.settled_unmetered, before.reserved) == (WORST, 0, 0)
    refused = admit(ctl, "kol", boundary - MICRO)
    assert isinstance(refused, Rejected) and refused.reason == "budget_exceeded"
    assert "next billing period, which starts at 2026-11-30T18:30:00Z" in refused.message

    at = ctl.spend("kol", now=boundary)  # the cached period ended: read again
    assert at.period == Window(boundary, utc(2026, 12, 31, 18, 30))
    assert at.metered == Decimal("0.0005")
    exactly = admit(ctl, "kol", boundary, prompt=500, max_tokens=500)  # 0.0015: spend + it = the cap
    assert isinstance(exactly, Admitted) and exactly.reserved == Decimal("0.0015")
    assert isinstance(admit(ctl, "kol", boundary, prompt=1, max_tokens=0), Rejected)  # one token over
    assert ctl.spend("kol", now=boundary).total == WORST
    # the old period is as it was
    assert ctl.spend("kol", now=utc(2026, 11, 30, 18, 0)).metered == WORST


def test_a_customer_without_a_calendar_counts_by_utc_month(engine, budget_settings, ingest, calendar):
    """No billing record (no calendar), and a billing record on the default schedule (UTC, anchor
    day 1, which has no period rows): both by UTC calendar month."""
    calendar("utc-billed")  # UTC, anchor day 1
    ctl = AdmissionController(engine, budget_settings)
    for customer in ("unknown-to-billing", "utc-billed"):
        ingest(customer, utc(2026, 10, 31, 23, 59, 59), 0, 1)
        ingest(customer, utc(2026, 11, 1), 0, 10)
        ingest(customer, utc(2026, 11, 30, 23, 59, 59), 0, 100)
        ingest(customer, utc(2026, 12, 1), 0, 1000)
        november = ctl.spend(customer, now=utc(2026, 11, 1))
        assert november.period == Window(utc(2026, 11, 1), utc(2026, 12, 1))
        assert november.metered == output_cost(110)
        assert ctl.spend(customer, now=utc(2026, 11, 1) - MICRO).metered == output_cost(1)
        assert ctl.spend(customer, now=utc(2026, 12, 1)).metered == output_cost(1000)


def test_anchor_day_15_counts_usage_settled_costs_and_warnings_from_the_15th(
        engine, budget_settings, ingest, calendar):
    """Anchor day 15 (UTC): the period is [15th 00:00, next 15th). Usage and settled costs of the 14th
    are the previous period's; soft mode warns on the current period's spend only."""
    calendar("mid", "UTC", 15)
    set_budget(engine, "mid", monthly_cap=Decimal("0.003"), mode="soft")
    ingest("mid", utc(2026, 11, 14, 23, 59, 59), 0, 5000)  # 0.01, the previous period's
    ingest("mid", utc(2026, 11, 15), 0, 100)  # 0.0002
    ctl = AdmissionController(engine, budget_settings)
    old = admit(ctl, "mid", utc(2026, 11, 14, 23, 59))  # admitted and settled in the previous period
    assert isinstance(old, Admitted) and old.warning is not None  # that period is over its cap
    ctl.settle_sync(old.request_id, input_tokens=PROMPT, cached_input_tokens=0, output_tokens=MAX_TOKENS,
                    event_source="s", event_id="not-metered-yet", now=utc(2026, 11, 14, 23, 59, 30))

    now = utc(2026, 11, 15, 12)
    spend = ctl.spend("mid", now=now)
    assert spend.period == Window(utc(2026, 11, 15), utc(2026, 12, 15))
    assert (spend.metered, spend.settled_unmetered, spend.reserved) == (Decimal("0.0002"), 0, 0)
    first = admit(ctl, "mid", now)  # 0.0002 + 0.002 <= 0.003: no warning
    assert isinstance(first, Admitted) and first.warning is None and first.headers == {}
    second = admit(ctl, "mid", now)  # 0.0022 + 0.002 > 0.003: admitted, with a warning
    assert isinstance(second, Admitted) and WARNING_HEADER in second.headers
    # housekeeping drops the previous period's settled row, not this period's reservations
    ctl.housekeep("mid", now)
    with engine.connect() as conn:
        states = sorted(conn.execute(select(budget_reservations.c.state)
                                     .where(budget_reservations.c.customer_id == "mid")).scalars())
    assert states == ["reserved", "reserved"]
    assert ctl.spend("mid", now=utc(2026, 11, 14, 23, 59, 59)).metered == Decimal("0.01")


def test_new_york_period_across_the_dst_change(engine, budget_settings, ingest, calendar):
    """America/New_York, anchor day 1: November's period starts at midnight EDT (04:00Z) and ends at
    midnight EST (05:00Z): 30 days and one hour. Usage at 2026-12-01T04:59:59Z (still November, local)
    counts in it; at 05:00Z in December's."""
    calendar("nyc", "America/New_York")
    ctl = AdmissionController(engine, budget_settings)
    ingest("nyc", utc(2026, 11, 1, 3, 59, 59), 0, 1)  # Oct 31 23:59:59 EDT
    ingest("nyc", utc(2026, 11, 1, 4), 0, 10)  # Nov 1 00:00 EDT
    ingest("nyc", utc(2026, 11, 1, 6, 30), 0, 100)  # Nov 1 01:30 EST, the repeated hour's second pass
    ingest("nyc", utc(2026, 12, 1, 4, 59, 59), 0, 1000)  # Nov 30 23:59:59 EST
    ingest("nyc", utc(2026, 12, 1, 5), 0, 10000)  # Dec 1 00:00 EST

    november = ctl.spend("nyc", now=utc(2026, 12, 1, 4, 59, 59))
    assert november.period == Window(utc(2026, 11, 1, 4), utc(2026, 12, 1, 5))
    assert november.period.duration == timedelta(days=30, hours=1)
    assert november.metered == output_cost(1110)
    assert ctl.spend("nyc", now=utc(2026, 12, 1, 5)).metered == output_cost(10000)
    october = ctl.spend("nyc", now=utc(2026, 11, 1, 3, 59, 59))
    assert october.period == Window(utc(2026, 10, 1, 4), utc(2026, 11, 1, 4))
    assert october.metered == output_cost(1)


def test_a_calendar_set_while_a_period_is_cached_is_read_at_the_next_spend(engine, budget_settings, ingest, calendar):
    """The period is kept until it ends, but metering locates the instant again in the statement that
    reads the tokens: a calendar changed meanwhile (billing re-cuts the customer's totals) is seen at
    once."""
    now = utc(2026, 11, 15, 12)
    ingest("moving", utc(2026, 10, 31, 19), 0, 100)  # October in UTC; November in Kolkata
    ctl = AdmissionController(engine, budget_settings)
    assert ctl.spend("moving", now=now).period == Window.month_of(now)
    assert ctl.spend("moving", now=now).metered == 0
    calendar("moving", "Asia/Kolkata")
    after = ctl.spend("moving", now=now)
    assert after.period == Window(utc(2026, 10, 31, 18, 30), utc(2026, 11, 30, 18, 30))
    assert after.metered == output_cost(100)


def test_the_period_read_does_not_depend_on_the_sessions_time_zone(db_url, calendar):
    """The UTC month of a customer without a calendar, and a calendar's period, read on a session
    whose time zone is not UTC (timestamptz + interval '1 month' would follow the session's zone)."""
    from metering.budget_reads import billing_period_of, period_tokens

    calendar("kol", "Asia/Kolkata")
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")  # UTC+14
        assert billing_period_of(conn, "nobody", utc(2026, 11, 30, 23)) == Window(utc(2026, 11, 1), utc(2026, 12, 1))
        assert billing_period_of(conn, "nobody", utc(2026, 12, 1)) == Window(utc(2026, 12, 1), utc(2027, 1, 1))
        assert billing_period_of(conn, "kol", utc(2026, 11, 30, 18, 30)) == Window(
            utc(2026, 11, 30, 18, 30), utc(2026, 12, 31, 18, 30))
        read = period_tokens(conn, "nobody", utc(2026, 2, 28, 23, 59), recorded_of=[("s", "unknown")])
        assert (read.period, read.sums, read.recorded) == (Window(utc(2026, 2, 1), utc(2026, 3, 1)), {}, set())
