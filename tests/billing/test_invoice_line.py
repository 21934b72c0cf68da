"""`billing.invoice.InvoiceLine`'s own checks, table-driven: every refusal with its exact message,
the service period's edges (end one microsecond after start, equal, before), and edges given in
another zone or as UTC made another way, kept as the same instant in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from billing.errors import InvoiceError, PeriodError
from billing.invoice import InvoiceLine

D = Decimal
START = datetime(2026, 2, 1, tzinfo=UTC)
END = datetime(2026, 3, 1, tzinfo=UTC)


def line(**changes) -> InvoiceLine:
    fields = dict(id="l1", rated_line_id="l1", kind="usage", charge_key="c0", meter="output_tokens", group="m",
                  quantity=D("1000"), unit_price=D("0.002"), precise_amount=D("2.000000000000"), amount=D("2.00"),
                  period="2026-02", service_period_start=START, service_period_end=END)
    fields.update(changes)
    return InvoiceLine(**fields)


@pytest.mark.parametrize("kind", ["usage", "minimum", "credit"])
def test_every_line_kind_is_accepted(kind):
    assert line(kind=kind).kind == kind


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"id": ""}, "an invoice line needs an id and the rated line id it comes from"),
        ({"rated_line_id": ""}, "an invoice line needs an id and the rated line id it comes from"),
        ({"kind": "tax"}, "line l1: kind 'tax' is not one of usage, minimum, credit"),
        ({"kind": "Usage"}, "line l1: kind 'Usage' is not one of usage, minimum, credit"),
        ({"quantity": 1000}, "line l1: quantity must be a finite Decimal, got 1000"),
        ({"quantity": D("NaN")}, "line l1: quantity must be a finite Decimal, got Decimal('NaN')"),
        ({"precise_amount": D("Infinity")}, "line l1: precise_amount must be a finite Decimal, got Decimal('Infinity')"),
        ({"precise_amount": 2.0}, "line l1: precise_amount must be a finite Decimal, got 2.0"),
        ({"amount": "2.00"}, "line l1: amount must be a finite Decimal, got '2.00'"),
        ({"amount": D("-Infinity")}, "line l1: amount must be a finite Decimal, got Decimal('-Infinity')"),
        ({"unit_price": 0.002}, "line l1: unit_price must be a Decimal or None"),
        ({"unit_price": "0.002"}, "line l1: unit_price must be a Decimal or None"),
        ({"service_period_start": datetime(2026, 2, 1)},
         "line l1: service_period_start 2026-02-01T00:00:00 has no time zone: give an aware datetime (UTC)"),
        ({"service_period_end": datetime(2026, 3, 1)},
         "line l1: service_period_end 2026-03-01T00:00:00 has no time zone: give an aware datetime (UTC)"),
        ({"service_period_start": "2026-02-01"}, "line l1: service_period_start must be a datetime, got str"),
        ({"service_period_end": None}, "line l1: service_period_end must be a datetime, got NoneType"),
        ({"service_period_end": START},
         "line l1: service period end 2026-02-01T00:00:00+00:00 is not after its start"),
        ({"service_period_end": START - timedelta(microseconds=1)},
         "line l1: service period end 2026-01-31T23:59:59.999999+00:00 is not after its start"),
        # an end given in another zone is compared (and named) in UTC
        ({"service_period_end": datetime(2026, 1, 31, 19, tzinfo=ZoneInfo("America/New_York"))},
         "line l1: service period end 2026-02-01T00:00:00+00:00 is not after its start"),
    ],
)
def test_invoice_line_refuses(changes, message):
    with pytest.raises(InvoiceError) as err:
        line(**changes)
    assert str(err.value) == message


def test_a_bad_period_label_is_refused_with_the_periods_message():
    with pytest.raises(PeriodError) as err:
        line(period="2026-13")
    assert str(err.value) == "period '2026-13' has month 13: the month must be 01..12"


def test_the_shortest_service_period_is_one_microsecond():
    one = line(service_period_end=START + timedelta(microseconds=1))
    assert one.service_period_end - one.service_period_start == timedelta(microseconds=1)


def test_a_line_keeps_its_values():
    got = line(unit_price=None, quantity=D("0"), amount=D("-2.00"), precise_amount=D("-2.000000000000"))
    assert (got.id, got.rated_line_id, got.kind, got.charge_key, got.meter, got.group) == (
        "l1", "l1", "usage", "c0", "output_tokens", "m")
    assert (got.quantity, got.unit_price, got.precise_amount, got.amount) == (D(0), None, D("-2.000000000000"),
                                                                               D("-2.00"))
    assert (got.service_period_start, got.service_period_end) == (START, END)
    assert not got.is_adjustment and line(id="adj-1").is_adjustment


@pytest.mark.parametrize(
    "zone",
    [ZoneInfo("Europe/Berlin"), timezone(timedelta(hours=-5)), UTC, ZoneInfo("UTC")],
)
def test_edges_in_another_zone_are_kept_in_utc(zone):
    got = line(service_period_start=START.astimezone(zone), service_period_end=END.astimezone(zone))
    assert (got.service_period_start, got.service_period_end) == (START, END)
    assert got.service_period_start.tzinfo is UTC and got.service_period_end.tzinfo is UTC
    assert got.service_period_start.isoformat() == "2026-02-01T00:00:00+00:00"
