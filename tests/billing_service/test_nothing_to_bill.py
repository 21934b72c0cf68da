"""A period with no line (no usage, no minimum, no adjustment) gets no numbered invoice: the run lists
it as "nothing to bill". A plan assigned before the customer's first plan needs --backdate."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing_service.customers import assign_plan, set_customer
from billing_service.run import billing_run
from tests.billing_service.conftest import BOOK_YAML, cost_model, table_counts

T0 = datetime(2026, 1, 20, tzinfo=UTC)
APR_2 = datetime(2026, 4, 2, 1, tzinfo=UTC)  # March's grace window is over
MINIMUM_BOOK_YAML = BOOK_YAML.replace("id: bill-usd", "id: bill-min") + 'minimum: "5.00"\n'


def invoices(conn) -> list[tuple[str, str, str | None, str]]:
    return [tuple(r) for r in conn.execute(
        "SELECT customer_id, period, number, status FROM billing_invoices ORDER BY customer_id, period_start")]


@pytest.fixture
def customers(conn, metering, tmp_path):
    set_customer(conn, "acme", now=T0)
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-01-01", now=T0)  # first plan: no --backdate
    set_customer(conn, "mini", now=T0)
    assign_plan(conn, "mini", MINIMUM_BOOK_YAML, "bill-min.yaml", "2026-01-01", now=T0)
    metering.request("acme", datetime(2026, 3, 3, tzinfo=UTC), input_tokens=1_000_000, output=250_000)  # 4.00


@pytest.mark.parametrize("only", [None, "acme"], ids=["bulk", "per-customer"])
def test_periods_with_no_line_get_no_invoice_and_are_listed(conn, customers, only):
    result = billing_run(conn, "2026-03", now=APR_2, customer_id=only, cost_model=cost_model())
    assert [(n.customer_id, n.period) for n in result.nothing_to_bill] == [("acme", "2026-01"), ("acme", "2026-02")]
    assert result.to_json()["nothing_to_bill"] == [{"customer_id": "acme", "period": "2026-01"},
                                                   {"customer_id": "acme", "period": "2026-02"}]
    acme = [(o.period, o.status, o.total) for o in result.invoices if o.customer_id == "acme"]
    assert acme == [("2026-03", "open", Decimal("4.00"))]
    expected = [("acme", "2026-03", "INV-2026-000001", "open")]
    if only is None:  # a minimum is a line: every period of mini is billed, as before
        assert [(o.period, o.total) for o in result.invoices if o.customer_id == "mini"] == [
            ("2026-01", Decimal("5.00")), ("2026-02", Decimal("5.00")), ("2026-03", Decimal("5.00"))]
        expected = [("acme", "2026-03", "INV-2026-000001", "open"), *[
            ("mini", f"2026-0{m}", f"INV-2026-00000{m + 1}", "open") for m in (1, 2, 3)]]
    assert invoices(conn) == expected
    again = billing_run(conn, "2026-03", now=APR_2, customer_id=only, cost_model=cost_model())
    assert [(n.customer_id, n.period) for n in again.nothing_to_bill] == [("acme", "2026-01"), ("acme", "2026-02")]
    assert invoices(conn) == expected


def test_a_draft_made_while_the_period_was_open_stays_unnumbered_if_it_has_no_line(conn, customers, metering):
    early = billing_run(conn, "2026-02", now=datetime(2026, 2, 10, tzinfo=UTC), customer_id="acme",
                        cost_model=cost_model())
    assert [(o.period, o.status, o.action) for o in early.invoices] == [("2026-02", "draft", "created")]
    assert [(n.period) for n in early.nothing_to_bill] == ["2026-01"]
    result = billing_run(conn, "2026-03", now=APR_2, customer_id="acme", cost_model=cost_model())
    assert [n.period for n in result.nothing_to_bill] == ["2026-01", "2026-02"]
    assert invoices(conn) == [("acme", "2026-02", None, "draft"), ("acme", "2026-03", "INV-2026-000001", "open")]
    metering.request("acme", datetime(2026, 2, 5, tzinfo=UTC), input_tokens=1_000_000, output=0)  # late: 2.00
    late = billing_run(conn, "2026-03", now=APR_2, customer_id="acme", cost_model=cost_model())
    assert [(o.period, o.status, o.number, o.total) for o in late.invoices] == [
        ("2026-02", "open", "INV-2026-000002", Decimal("2.00"))]
    assert [n.period for n in late.nothing_to_bill] == ["2026-01"]


def test_the_cli_lists_nothing_to_bill(conn, customers, cli):
    shown = cli("billing", "run", "--period", "2026-03", "--customer", "acme", now=APR_2)
    assert shown.code == 0, shown.err
    assert "acme: period 2026-01 has nothing to bill (no usage, no minimum): no invoice" in shown.out
    assert "acme: period 2026-02 has nothing to bill (no usage, no minimum): no invoice" in shown.out
    as_json = cli("billing", "run", "--period", "2026-03", "--customer", "acme", "--json", now=APR_2).json()
    assert as_json["nothing_to_bill"] == [{"customer_id": "acme", "period": "2026-01"},
                                          {"customer_id": "acme", "period": "2026-02"}]


def test_a_plan_before_the_first_plan_needs_backdate(conn, cli, tmp_path):
    set_customer(conn, "late", now=T0)
    (tmp_path / "usd.yaml").write_text(BOOK_YAML)
    book = str(tmp_path / "usd.yaml")
    assert cli("plans", "assign", "--customer", "late", "--price-book", book, "--from", "2026-11-01", now=T0).code == 0
    before = table_counts(conn)
    refused = cli("plans", "assign", "--customer", "late", "--price-book", book, "--from", "2026-01-01", now=T0)
    assert refused.code == 2
    assert refused.err.strip().splitlines() == [
        "error: customer late's first plan is in force from period 2026-11; a plan from 2026-01-01 (period 2026-01) "
        "would bill the periods before it: pass --backdate to do so"]
    assert table_counts(conn) == before
    same = cli("plans", "assign", "--customer", "late", "--price-book", book, "--from", "2026-11-01", now=T0)
    assert same.code == 0  # not before the first plan: no --backdate needed
    later = cli("plans", "assign", "--customer", "late", "--price-book", book, "--from", "2026-12-01", now=T0)
    assert later.code == 0
    done = cli("plans", "assign", "--customer", "late", "--price-book", book, "--from", "2026-01-01", "--backdate",
               "--json", now=T0)
    assert done.code == 0, done.err
    assert done.json()["effective_period"] == "2026-01"
