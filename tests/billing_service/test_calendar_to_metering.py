"""Billing hands each customer's calendar to metering (`set_customer` -> `metering.calendars.set_calendar`,
same transaction): metering keeps the customer's period totals by the periods billing cuts, and a
customer without a billing record by UTC calendar month. Period edges are literal UTC instants
written out by hand; each boundary is tested at the instant the period ends and one microsecond
before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from billing_service.customers import set_customer

NOW = datetime(2026, 5, 1, tzinfo=UTC)
TICK = timedelta(microseconds=1)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


# Asia/Kolkata (UTC+05:30, no DST), anchor day 15: each period starts on the 15th at 00:00 local,
# the 14th at 18:30 UTC.
KOLKATA_15 = {"2026-02": utc(2026, 2, 14, 18, 30), "2026-03": utc(2026, 3, 14, 18, 30),
              "2026-04": utc(2026, 4, 14, 18, 30)}


def request_totals(conn, customer: str) -> dict[datetime, tuple[int, int]]:
    """period_start -> (requests, input tokens) kept in request_period_totals for the customer."""
    rows = conn.execute("SELECT period_start, sum(requests), sum(input_tokens) FROM request_period_totals "
                        "WHERE customer_id = %s GROUP BY 1 ORDER BY 1", (customer,)).fetchall()
    return {start: (int(requests), int(tokens)) for start, requests, tokens in rows}


def task_totals(conn, customer: str) -> dict[datetime, tuple[int, int]]:
    rows = conn.execute("SELECT period_start, succeeded, failed FROM task_period_totals WHERE customer_id = %s "
                        "ORDER BY 1", (customer,)).fetchall()
    return {start: (succeeded, failed) for start, succeeded, failed in rows}


def calendar(conn, customer: str):
    return conn.execute("SELECT timezone, anchor_day FROM customer_calendars WHERE customer_id = %s",
                        (customer,)).fetchone()


def write_around_march_end(metering, customer: str) -> None:
    """One request on each side of the March period's start and of its end (distinct input tokens
    tell them apart), a task that fails one microsecond before the end and one that succeeds at it."""
    start, end = KOLKATA_15["2026-03"], KOLKATA_15["2026-04"]
    metering.request(customer, start - TICK, input_tokens=1)  # the last instant of February's period
    metering.request(customer, start, input_tokens=10)  # March's first instant
    metering.request(customer, end - TICK, input_tokens=100)  # March's last instant
    metering.request(customer, end, input_tokens=1000)  # the instant March ends: April's first
    metering.task(customer, "t-before", "failed", end - TICK)
    metering.task(customer, "t-at-end", "succeeded", end)


def test_a_customer_created_in_kolkata_with_anchor_15_gets_totals_by_its_own_periods(conn, metering):
    customer, changed = set_customer(conn, "kol15", now=NOW, timezone="Asia/Kolkata", anchor_day=15)
    assert changed and (customer.timezone, customer.anchor_day) == ("Asia/Kolkata", 15)
    assert calendar(conn, "kol15") == ("Asia/Kolkata", 15)

    write_around_march_end(metering, "kol15")

    assert request_totals(conn, "kol15") == {KOLKATA_15["2026-02"]: (1, 1), KOLKATA_15["2026-03"]: (2, 110),
                                             KOLKATA_15["2026-04"]: (1, 1000)}
    assert task_totals(conn, "kol15") == {KOLKATA_15["2026-03"]: (0, 1), KOLKATA_15["2026-04"]: (1, 0)}


def test_a_customer_without_a_billing_record_keeps_utc_calendar_months(conn, metering):
    metering.request("nobody", utc(2026, 3, 31, 23, 59, 59, 999999), input_tokens=1)
    metering.request("nobody", utc(2026, 4, 1), input_tokens=10)
    metering.request("nobody", KOLKATA_15["2026-04"], input_tokens=100)  # no boundary here for UTC months

    assert calendar(conn, "nobody") is None
    assert request_totals(conn, "nobody") == {utc(2026, 3, 1): (1, 1), utc(2026, 4, 1): (2, 110)}


def test_usage_before_the_billing_record_moves_to_the_customer_s_periods_when_the_record_is_created(
        conn, metering):
    write_around_march_end(metering, "late")
    assert request_totals(conn, "late") == {utc(2026, 3, 1): (2, 11), utc(2026, 4, 1): (2, 1100)}

    set_customer(conn, "late", now=NOW, timezone="Asia/Kolkata", anchor_day=15)

    assert calendar(conn, "late") == ("Asia/Kolkata", 15)
    assert request_totals(conn, "late") == {KOLKATA_15["2026-02"]: (1, 1), KOLKATA_15["2026-03"]: (2, 110),
                                            KOLKATA_15["2026-04"]: (1, 1000)}
    assert task_totals(conn, "late") == {KOLKATA_15["2026-03"]: (0, 1), KOLKATA_15["2026-04"]: (1, 0)}


def test_a_time_zone_or_anchor_change_rebuilds_the_totals_by_the_new_periods(conn, metering):
    set_customer(conn, "moves", now=NOW)  # UTC, anchor day 1
    assert calendar(conn, "moves") == ("UTC", 1)
    write_around_march_end(metering, "moves")
    assert request_totals(conn, "moves") == {utc(2026, 3, 1): (2, 11), utc(2026, 4, 1): (2, 1100)}

    set_customer(conn, "moves", now=NOW, timezone="Asia/Kolkata")  # anchor day 1: 1st 00:00 local
    assert calendar(conn, "moves") == ("Asia/Kolkata", 1)
    assert request_totals(conn, "moves") == {utc(2026, 2, 28, 18, 30): (2, 11), utc(2026, 3, 31, 18, 30): (2, 1100)}

    set_customer(conn, "moves", now=NOW, anchor_day=15)
    assert calendar(conn, "moves") == ("Asia/Kolkata", 15)
    assert request_totals(conn, "moves") == {KOLKATA_15["2026-02"]: (1, 1), KOLKATA_15["2026-03"]: (2, 110),
                                             KOLKATA_15["2026-04"]: (1, 1000)}
