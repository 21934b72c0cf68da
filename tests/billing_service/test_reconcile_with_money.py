"""`infermeter reconcile` (metering's raw events against rollups) also checks money where billing data
exists: the billing periods of invoices overlapping the window, or those given with --period."""

from __future__ import annotations

from datetime import UTC, datetime

FEB_WINDOW = ("--from", "2026-02-01T00:00:00Z", "--to", "2026-03-01T00:00:00Z")


def test_reconcile_checks_the_money_of_the_periods_in_the_window(conn, metering, february, cli):
    ok = cli("reconcile", *FEB_WINDOW)
    assert ok.code == 0, ok.out + ok.err
    assert "reconcile ok" in ok.out and "money 2026-02: ok: 1 customer invoices checked" in ok.out

    metering.request("acme", datetime(2026, 2, 27, tzinfo=UTC), input_tokens=1_000_000, output=0)  # late usage
    late = cli("reconcile", *FEB_WINDOW, "--json")
    assert late.code == 1
    payload = late.json()
    assert payload["ok"] is False and payload["differences"] == []  # metering itself agrees with itself
    [money] = payload["money"]
    assert money["period"] == "2026-02" and [d["what"] for d in money["differences"]] == [
        "quantity uncached_input_tokens/m1", "amount uncached_input_tokens/m1"]
    text = cli("reconcile", *FEB_WINDOW)
    assert text.code == 1 and "money difference" in text.err and "reconcile ok" in text.out

    cli("billing", "run", "--period", "2026-03", now=datetime(2026, 3, 10, tzinfo=UTC))  # adjustments
    assert cli("reconcile", *FEB_WINDOW).code == 0


def test_reconcile_with_explicit_periods_and_without_billing_data(conn, metering, february, cli):
    explicit = cli("reconcile", "--from", "2026-02-10T00:00:00Z", "--to", "2026-02-10T01:00:00Z",
                   "--period", "2026-02", "--period", "2026-02", "--json")
    assert explicit.code == 0, explicit.err
    assert [m["period"] for m in explicit.json()["money"]] == ["2026-02"]
    nothing = cli("reconcile", "--from", "2025-06-01T00:00:00Z", "--to", "2025-06-02T00:00:00Z", "--json")
    assert nothing.code == 0 and nothing.json()["money"] == []
    bad = cli("reconcile", *FEB_WINDOW, "--period", "2026-13")
    assert bad.code == 2 and "2026-13" in bad.err
