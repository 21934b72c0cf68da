"""Bad input: one clear `error: ...` line, exit status 2, no traceback, and nothing written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing_service.customers import assign_plan, set_customer
from tests.billing_service.conftest import BOOK_YAML, EUR_BOOK_YAML, auth, table_counts

T0 = datetime(2026, 1, 20, tzinfo=UTC)


@pytest.fixture
def setup(conn, tmp_path):
    set_customer(conn, "acme", now=T0)
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=T0)
    set_customer(conn, "yen", now=T0, currency="JPY")
    (tmp_path / "eur.yaml").write_text(EUR_BOOK_YAML)
    (tmp_path / "usd.yaml").write_text(BOOK_YAML)
    (tmp_path / "broken.yaml").write_text("id: x\ncurrency: USD\ncharges: []\n")
    return tmp_path


CASES = [
    (["billing", "run", "--period", "2026-2"], "is not of the form YYYY-MM"),
    (["billing", "run", "--period", "2026-13"], "the month must be 01..12"),
    (["billing", "run", "--period", "Feb 2026"], "is not of the form YYYY-MM"),
    (["billing", "run", "--period", "2026-02", "--customer", "nobody"], "unknown customer 'nobody'"),
    (["billing", "reconcile", "--period", "26-02"], "is not of the form YYYY-MM"),
    (["invoice", "preview", "--customer", "nobody", "--period", "2026-02"], "unknown customer 'nobody'"),
    (["invoice", "preview", "--customer", "acme", "--period", "2026-02", "--price-book", "{tmp}/eur.yaml"],
     "is in EUR but customer acme is billed in USD"),
    (["invoices", "list", "--period", "2026/02"], "is not of the form YYYY-MM"),
    (["invoices", "list", "--status", "sent"], "unknown status 'sent'"),
    (["invoices", "list", "--customer", "nobody"], "unknown customer"),
    (["invoices", "show", "inv_nope"], "unknown invoice 'inv_nope'"),
    (["invoices", "void", "INV-2026-000001"], "unknown invoice"),
    (["invoices", "credit-note", "inv_nope", "--reason", "x"], "unknown invoice"),
    (["customers", "set", "newco", "--timezone", "Mars/Olympus_Mons"], "unknown time zone 'Mars/Olympus_Mons'"),
    (["customers", "set", "newco", "--timezone", "europe/berlin"], "unknown time zone"),
    (["customers", "set", "newco", "--currency", "XYZ"], "unknown currency 'XYZ'"),
    (["customers", "set", "newco", "--anchor-day", "32"], "anchor day 32 is out of range"),
    (["customers", "set", "new co"], "is not valid"),
    (["customers", "set", "newco", "--email", "not-an-address"], "is not an e-mail address"),
    (["customers", "set", "acme", "--timezone", "Asia/Kolkata"], "are fixed"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/eur.yaml", "--from", "2026-03-01"],
     "is in EUR but customer acme is billed in USD"),
    (["plans", "assign", "--customer", "nobody", "--price-book", "{tmp}/usd.yaml", "--from", "2026-03-01"],
     "unknown customer"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/usd.yaml", "--from", "2026/03/01"],
     "is not a date of the form YYYY-MM-DD"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/usd.yaml", "--from", "2026-02-30"],
     "is not a date of the form YYYY-MM-DD"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/missing.yaml", "--from", "2026-03-01"],
     "cannot read the price book"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/broken.yaml", "--from", "2026-03-01"],
     "charges"),
    (["plans", "assign", "--customer", "acme", "--price-book", "{tmp}/usd.yaml", "--from", "2026-01-01"],
     "customer acme's first plan is in force from period 2026-02; a plan from 2026-01-01 (period 2026-01) would "
     "bill the periods before it: pass --backdate to do so"),
    (["credits", "grant", "--customer", "acme", "--amount", "10.005"], "has more decimals than USD allows"),
    (["credits", "grant", "--customer", "yen", "--amount", "100.5"], "has more decimals than JPY allows"),
    (["credits", "grant", "--customer", "acme", "--amount", "-5"], "must be greater than zero"),
    (["credits", "grant", "--customer", "acme", "--amount", "ten"], "is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "NaN"], "is not a decimal number"),
    # amounts are plain decimals that fit the NUMERIC(38, 12) columns: no exponent, no NaN or Infinity
    (["credits", "grant", "--customer", "acme", "--amount", "1e3"],
     "amount '1e3' is not a decimal number such as 50.00 (digits, at most one '.', no exponent)"),
    (["credits", "grant", "--customer", "acme", "--amount", "1E+3"], "amount '1E+3' is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "Infinity"], "amount 'Infinity' is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "-inf"], "amount '-inf' is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "nan"], "amount 'nan' is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "1_000"], "amount '1_000' is not a decimal number"),
    (["credits", "grant", "--customer", "acme", "--amount", "9" * 32],
     f"amount {'9' * 32} has 32 digits before the decimal point; at most 26 fit"),
    (["credits", "grant", "--customer", "acme", "--amount", "9" * 27 + ".00"], "has 27 digits before the decimal point"),
    (["credits", "grant", "--customer", "acme", "--amount", "1.0000000000001"],
     "amount 1.0000000000001 has 13 decimal places; at most 12 fit"),
    (["credits", "grant", "--customer", "acme", "--amount", "5", "--expires", "2026-13-01"],
     "is not a date of the form YYYY-MM-DD"),
    (["credits", "grant", "--customer", "acme", "--amount", "5", "--expires", "2026-01-01"], "is not in the future"),
    (["credits", "grant", "--customer", "nobody", "--amount", "5"], "unknown customer"),
    (["credits", "show", "--customer", "nobody"], "unknown customer"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_one_clear_line_and_writes_nothing(conn, setup, cli, args, message):
    before = table_counts(conn)
    result = cli(*[a.replace("{tmp}", str(setup)) for a in args], now=T0)
    assert result.code == 2, (result.out, result.err)
    assert result.err.startswith("error: ") and message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err + result.out
    assert table_counts(conn) == before


def test_bad_input_over_http_is_a_400_and_writes_nothing(conn, setup, api):
    client, keys = api
    admin = auth(keys["admin"])
    before = table_counts(conn)
    for method, path, body, status, message in [
        ("PUT", "/v1/billing/customers/newco", {"timezone": "Nowhere/City"}, 400, "unknown time zone"),
        ("POST", "/v1/billing/customers/acme/plans", {"price_book": EUR_BOOK_YAML, "from": "2026-03-01"}, 400, "EUR"),
        ("POST", "/v1/billing/customers/nobody/plans", {"price_book": BOOK_YAML, "from": "2026-03-01"}, 404,
         "unknown customer"),
        ("POST", "/v1/billing/customers/acme/credits", {"amount": "1.001"}, 400, "more decimals"),
        ("POST", "/v1/billing/customers/acme/plans", {"price_book": BOOK_YAML, "from": "2026-01-01"}, 400,
         "would bill the periods before it: send \"backdate\": true to do so"),
        ("POST", "/v1/billing/customers/acme/credits", {"amount": "1e3"}, 400, "is not a decimal number"),
        ("POST", "/v1/billing/customers/acme/credits", {"amount": "9" * 32}, 400, "at most 26 fit"),
        ("POST", "/v1/billing/runs", {"period": "2026-1"}, 400, "YYYY-MM"),
        ("GET", "/v1/invoices/preview?period=2026-02&customer_id=nobody", None, 404, "unknown customer"),
        ("GET", "/v1/invoices/preview?period=02-2026&customer_id=acme", None, 400, "YYYY-MM"),
    ]:
        r = client.request(method, path, json=body, headers=admin)
        assert r.status_code == status, (path, r.text)
        assert message in r.json()["error"]["message"]
    assert table_counts(conn) == before
