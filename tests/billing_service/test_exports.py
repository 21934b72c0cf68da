"""Finance exports: invoices, lines, revenue and usage as CSV and Parquet; `--as-of T` taken after late
usage and new billing runs equals, byte for byte, the export taken at T."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from billing_service.credits import issue_credit_note
from billing_service.customers import assign_plan, set_customer
from billing_service.exports import COLUMNS, KINDS, arrow_schema
from billing_service.invoices import record_payment_status, show_invoice
from billing_service.run import billing_run
from tests.billing_service.conftest import BOOK_YAML, EUR_BOOK_YAML, auth, cost_model, reference_total

T0 = datetime(2026, 1, 20, tzinfo=UTC)
FEB = (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
T1 = "2026-03-15T00:00:00Z"  # the moment the first exports are taken


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def received(conn, at: datetime) -> None:
    """Metering received every event written since the last call at `at` (the test's clock for received_at;
    the writer stamps the database's real time, which is later than every test time)."""
    conn.execute("UPDATE raw_events SET received_at = %s WHERE received_at > now() - interval '1 hour'", (at,))


@pytest.fixture
def month(conn, metering):
    """acme (UTC, USD) and beta (Europe/Berlin, EUR) billed from February; ghost has usage but no record.
    February is finalized on 2026-03-02, acme's invoice paid on 03-05 and partly credited on 03-06;
    March is a draft. Every event was received by 2026-03-10."""
    set_customer(conn, "acme", now=T0, name="Acme", email="billing@acme.test")
    set_customer(conn, "beta", now=T0, timezone="Europe/Berlin", currency="EUR")
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=T0)
    assign_plan(conn, "beta", EUR_BOOK_YAML, "bill-eur.yaml", "2026-02-01", now=T0)
    metering.request("acme", utc(2026, 2, 3, 10), input_tokens=1_000_000, cached=250_000, output=100_000,
                     task_id="t1", project="web")
    metering.task("acme", "t1", "succeeded", utc(2026, 2, 3, 11))
    metering.request("acme", utc(2026, 2, 10, 10), model="big", input_tokens=20_000, output=50_000)
    metering.usage("acme", "tool_calls", "40", utc(2026, 2, 11))
    metering.request("beta", utc(2026, 1, 31, 23, 30), input_tokens=3_000_000, output=7)  # Berlin: February
    metering.request("ghost", utc(2026, 2, 12), input_tokens=10)
    received(conn, utc(2026, 3, 1, 6))
    billing_run(conn, "2026-02", now=utc(2026, 3, 1, 12), cost_model=cost_model())
    billing_run(conn, "2026-02", now=utc(2026, 3, 2, 1), cost_model=cost_model())
    [feb] = [i for i in show_invoices(conn) if i["customer_id"] == "acme" and i["period"] == "2026-02"]
    record_payment_status(conn, feb["id"], "paid", utc(2026, 3, 5), now=utc(2026, 3, 5))
    issue_credit_note(conn, feb["id"], reason="goodwill", now=utc(2026, 3, 6), line_ids=[feb["lines"][0]["id"]])
    metering.request("acme", utc(2026, 3, 4), input_tokens=500_000, output=1_000)
    received(conn, utc(2026, 3, 10))
    billing_run(conn, "2026-03", now=utc(2026, 3, 10, 1), cost_model=cost_model())
    return feb


def show_invoices(conn) -> list[dict]:
    return [show_invoice(conn, r[0]) for r in conn.execute("SELECT id FROM billing_invoices ORDER BY id")]


def late_usage_and_runs(conn, metering) -> None:
    """After T1: February usage arrives late, the March run puts it on March as adjustments and finalizes
    March, another credit note is issued, beta pays."""
    metering.request("acme", utc(2026, 2, 27, 9), input_tokens=2_000_000, output=1_000, project="batch")
    metering.usage("acme", "tool_calls", "2.5", utc(2026, 2, 27, 9))
    metering.request("ghost", utc(2026, 2, 20), output=99)
    received(conn, utc(2026, 3, 20))
    billing_run(conn, "2026-03", now=utc(2026, 3, 21), cost_model=cost_model())
    billing_run(conn, "2026-03", now=utc(2026, 4, 2, 1), cost_model=cost_model())
    [beta] = [i for i in show_invoices(conn) if i["customer_id"] == "beta" and i["period"] == "2026-02"]
    record_payment_status(conn, beta["id"], "paid", utc(2026, 4, 3), now=utc(2026, 4, 3))
    [mar] = [i for i in show_invoices(conn) if i["customer_id"] == "acme" and i["period"] == "2026-03"]
    issue_credit_note(conn, mar["id"], reason="late fix", now=utc(2026, 4, 4), line_ids=[mar["lines"][0]["id"]])


def export_all(cli, tmp_path, tag: str, *as_of: str) -> dict[tuple[str, str, str], bytes]:
    out = {}
    for period in ("2026-02", "2026-03"):
        for kind in KINDS:
            shown = cli("export", kind, "--period", period, *as_of)
            assert shown.code == 0, shown.err
            out[(period, kind, "csv")] = shown.out.encode()
            path = tmp_path / f"{tag}-{kind}-{period}.parquet"
            written = cli("export", kind, "--period", period, "--format", "parquet", "--out", str(path), *as_of)
            assert written.code == 0, written.err
            out[(period, kind, "parquet")] = path.read_bytes()
    return out


def rows(data: bytes) -> list[dict]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def test_as_of_reproduces_the_exports_taken_then_byte_for_byte(conn, metering, month, cli, tmp_path):
    then = export_all(cli, tmp_path, "then")
    assert export_all(cli, tmp_path, "again") == then  # deterministic: same data, same bytes
    late_usage_and_runs(conn, metering)
    now = export_all(cli, tmp_path, "now")
    later = export_all(cli, tmp_path, "asof", "--as-of", T1)
    for key, data in then.items():
        assert later[key] == data, key
    changed = {key for key in then if now[key] != then[key]}
    assert {("2026-02", "revenue", "csv"), ("2026-02", "usage", "csv"), ("2026-03", "invoices", "csv"),
            ("2026-03", "lines", "csv"), ("2026-02", "invoices", "csv")} <= changed

    # what the files say, now: February's revenue, wherever it was invoiced, is February's rating
    revenue = rows(now[("2026-02", "revenue", "csv")])
    acme = [r for r in revenue if r["customer_id"] == "acme"]
    assert {r["invoiced_in"] for r in acme} == {"2026-02", "2026-03"}
    assert sum(Decimal(r["amount"]) for r in acme) == reference_total(metering.sent, "acme", *FEB)
    assert all(Decimal(r["net_amount"]) == Decimal(r["amount"]) - Decimal(r["credited"]) for r in revenue)
    assert sum(Decimal(r["credited"]) for r in acme) == Decimal(month["lines"][0]["amount"])
    assert {(r["customer_id"], r["currency"]) for r in revenue} == {("acme", "USD"), ("beta", "EUR")}
    big = [r for r in acme if r["meter"] == "output_tokens" and r["model"] == "big"]
    assert len(big) == 1 and big[0]["quantity"] == "50000"

    invoices_then = rows(then[("2026-02", "invoices", "csv")])
    assert [(r["customer_id"], r["number"], r["status"]) for r in invoices_then] == [
        ("acme", "INV-2026-000001", "paid"), ("beta", "INV-2026-000002", "open")]
    assert invoices_then[0]["status_since"] == "2026-03-05T00:00:00Z"
    assert invoices_then[0]["credit_notes_total"] == month["lines"][0]["amount"]
    assert [r["status"] for r in rows(now[("2026-02", "invoices", "csv")])] == ["paid", "paid"]
    march_then = rows(then[("2026-03", "invoices", "csv")])
    assert [(r["customer_id"], r["status"], r["number"]) for r in march_then] == [("acme", "draft", ""),
                                                                                    ("beta", "draft", "")]

    lines_now = rows(now[("2026-03", "lines", "csv")])
    adjustments = [r for r in lines_now if r["adjustment"] == "true"]
    assert adjustments and {r["period"] for r in adjustments} == {"2026-02"}
    assert {r["invoice_status"] for r in lines_now} == {"open"}

    usage_then = rows(then[("2026-02", "usage", "csv")])
    usage_now = rows(now[("2026-02", "usage", "csv")])

    def quantity(found, customer, meter, model=""):
        return sum(Decimal(r["quantity"]) for r in found
                   if (r["customer_id"], r["meter"]) == (customer, meter) and (not model or r["model"] == model))

    assert quantity(usage_then, "acme", "uncached_input_tokens") == 750_000 + 20_000
    assert quantity(usage_now, "acme", "uncached_input_tokens") == 750_000 + 20_000 + 2_000_000
    assert quantity(usage_now, "acme", "usage:tool_calls") == Decimal("42.5")
    assert quantity(usage_now, "acme", "successful_tasks") == 1 and quantity(usage_now, "acme", "task_attempts") == 1
    beta = [r for r in usage_now if r["customer_id"] == "beta"]
    assert {(r["period_start"], r["billed"]) for r in beta} == {("2026-01-31T23:00:00Z", "true")}
    ghost = [r for r in usage_now if r["customer_id"] == "ghost"]
    assert {(r["billed"], r["period_start"]) for r in ghost} == {("false", "2026-02-01T00:00:00Z")}
    assert quantity(usage_then, "ghost", "output_tokens") == 100 and quantity(usage_now, "ghost", "output_tokens") == 199


def test_csv_and_parquet_columns_types_and_fixed_metadata(conn, metering, month, cli, tmp_path):
    for kind in KINDS:
        path = tmp_path / f"{kind}.parquet"
        assert cli("export", kind, "--period", "2026-02", "--format", "parquet", "--out", str(path)).code == 0
        text = cli("export", kind, "--period", "2026-02").out
        header = text.splitlines()[0].split(",")
        assert header == [c.name for c in COLUMNS[kind]]
        table = pq.read_table(path)
        assert table.schema.equals(arrow_schema(kind), check_metadata=False)
        assert table.num_rows == len(text.splitlines()) - 1 > 0
        meta = pq.ParquetFile(path).metadata
        assert meta.created_by.startswith("parquet-cpp-arrow version ")
        assert set((meta.metadata or {}).keys()) == {b"ARROW:schema"}
        # the same rows in both files, value for value
        parsed = rows(text.encode())
        for column in COLUMNS[kind]:
            values = table.column(column.name).to_pylist()
            for row, value in zip(parsed, values, strict=True):
                if column.type == "decimal":
                    assert (Decimal(row[column.name]) if row[column.name] else None) == value
                elif column.type == "int":
                    assert int(row[column.name]) == value
                elif column.type == "bool":
                    assert row[column.name] == ("true" if value else "false")
                elif column.type == "timestamp":
                    assert row[column.name] == ("" if value is None else value.isoformat().replace("+00:00", "Z"))
                else:
                    assert row[column.name] == (value or "")


def test_bad_export_input_is_one_clear_error(conn, month, cli, tmp_path):
    for args, message in [
        (("export", "invoices", "--period", "2026-13"), "2026-13"),
        (("export", "invoices", "--period", "2026-02", "--format", "xlsx"), "csv or parquet"),
        (("export", "usage", "--period", "2026-02", "--as-of", "yesterday"), "--as-of"),
        (("export", "lines", "--period", "2026-02", "--out", str(tmp_path / "no" / "such" / "dir.csv")),
         "cannot write"),
    ]:
        result = cli(*args)
        assert result.code == 2 and message in result.err, (args, result.err)
    assert cli("export", "payments", "--period", "2026-02").code == 2  # no such command


def test_exports_download_from_the_admin_api(conn, month, cli, api):
    client, keys = api
    expected = cli("export", "revenue", "--period", "2026-02", "--as-of", T1).out.encode()
    got = client.get("/v1/billing/exports/revenue", params={"period": "2026-02", "as_of": T1},
                     headers=auth(keys["admin"]))
    assert got.status_code == 200, got.text
    assert got.content == expected
    assert got.headers["content-type"].startswith("text/csv")
    assert got.headers["content-disposition"] == 'attachment; filename="revenue-2026-02-asof-20260315T000000Z.csv"'
    parquet = client.get("/v1/billing/exports/lines", params={"period": "2026-02", "format": "parquet"},
                         headers=auth(keys["admin"]))
    assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"
    assert client.get("/v1/billing/exports/revenue", params={"period": "2026-02"},
                      headers=auth(keys["acme"])).status_code == 403
    bad = client.get("/v1/billing/exports/payments", params={"period": "2026-02"}, headers=auth(keys["admin"]))
    assert bad.status_code == 400 and "unknown export" in bad.json()["error"]["message"]
    bad = client.get("/v1/billing/exports/usage", params={"period": "2026-02", "format": "xml"},
                     headers=auth(keys["admin"]))
    assert bad.status_code == 400


def test_docs_list_every_export_column_with_its_type():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "billing.md").read_text()
    types = {"string": "string", "int": "int64", "decimal": "decimal(38,12)", "timestamp": "timestamp (µs, UTC)",
             "bool": "bool"}
    for kind, columns in COLUMNS.items():
        section = docs.split(f"**{kind}** (rows ordered by", 1)[1].split("\n\n", 2)[1]
        documented = [line.split("|")[1:3] for line in section.splitlines()[2:]]
        assert [(n.strip().strip("`"), t.strip()) for n, t in documented] == [
            (c.name, types[c.type]) for c in columns], kind
