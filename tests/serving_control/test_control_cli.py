"""`infermeter keys ...` and `infermeter budgets ...` against the test database."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import typer
from typer.testing import CliRunner

from infermeter.settings import get_settings
from infermeter.times import Window, utc_text
from serving.control_cli import budgets_app, keys_app, register_serve_commands
from serving.keys import KeyStore


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    app = typer.Typer()
    app.add_typer(keys_app, name="keys")
    app.add_typer(budgets_app, name="budgets")
    serve = typer.Typer()
    register_serve_commands(serve)
    serve.command("noop")(lambda: None)
    app.add_typer(serve, name="serve")
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, list(args))
    get_settings.cache_clear()


def test_keys_create_list_revoke(cli, engine):
    created = cli("keys", "create", "--customer", "cust-cli", "--project", "p1")
    assert created.exit_code == 0, created.output
    key_id = re.search(r"key id:\s+(\w+)", created.output).group(1)
    token = re.search(r"secret:\s+(\S+)", created.output).group(1)
    assert KeyStore(engine, get_settings()).authenticate_sync(token).customer_id == "cust-cli"
    listed = cli("keys", "list", "--customer", "cust-cli")
    assert key_id in listed.output and token not in listed.output and "active" in listed.output
    wrong = cli("keys", "revoke", key_id, "--customer", "someone-else")
    assert wrong.exit_code == 2 and "no key" in wrong.output and "Traceback" not in wrong.output
    assert cli("keys", "revoke", key_id, "--customer", "cust-cli").exit_code == 0
    assert "revoked" in cli("keys", "list", "--customer", "cust-cli").output
    again = cli("keys", "revoke", key_id, "--customer", "cust-cli")
    assert again.exit_code == 2 and "already revoked" in again.output


def test_budgets_set_show_clear(cli):
    result = cli("budgets", "set", "--customer", "cust-b", "--monthly-cap", "100.00", "--mode", "soft", "--rpm", "60")
    assert result.exit_code == 0, result.output
    result = cli("budgets", "set", "--customer", "cust-b", "--tpm", "1000")  # keeps cap, mode, rpm
    shown = cli("budgets", "show", "--customer", "cust-b")
    assert shown.exit_code == 0, shown.output
    assert all(s in shown.output for s in ("100.00", "soft", "60", "1000", "0.000000", "spent this period"))
    month = Window.month_of(datetime.now(UTC))  # a customer without a billing calendar: the UTC month
    assert f"billing period {utc_text(month.start)} to {utc_text(month.end)}" in shown.output
    bad = cli("budgets", "set", "--customer", "cust-b", "--monthly-cap", "lots")
    assert bad.exit_code == 2 and "decimal" in bad.output
    bad = cli("budgets", "set", "--customer", "cust-b", "--mode", "maybe")
    assert bad.exit_code == 2 and "--mode" in bad.output
    assert cli("budgets", "clear", "--customer", "cust-b").exit_code == 0
    assert cli("budgets", "show", "--customer", "cust-b").exit_code == 2


def test_replica_agent_command_refuses_bad_input_clearly(cli, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:9")
    get_settings.cache_clear()
    result = cli("serve", "replica-agent", "--vllm", "localhost:8000", "--deployment", "d", "--gpu-type", "cpu",
                 "--gpu-count", "1")
    assert result.exit_code == 2 and "http" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("cap", "message"),
    [("1e3", "--monthly-cap '1e3' is not a decimal number such as 50.00 (digits, at most one '.', no exponent)"),
     ("NaN", "--monthly-cap 'NaN' is not a decimal number such as 50.00 (digits, at most one '.', no exponent)"),
     ("Infinity",
      "--monthly-cap 'Infinity' is not a decimal number such as 50.00 (digits, at most one '.', no exponent)"),
     ("9" * 32, f"--monthly-cap {'9' * 32} has 32 digits before the decimal point; at most 26 fit"),
     ("1.0000000000001", "--monthly-cap 1.0000000000001 has 13 decimal places; at most 12 fit"),
     ("-5", "--monthly-cap must be a non-negative decimal number")],
)
def test_budgets_set_takes_a_plain_decimal_cap_that_fits_and_writes_nothing_otherwise(cli, cap, message):
    result = cli("budgets", "set", "--customer", "cust-cap", "--monthly-cap", cap)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"]
    assert cli("budgets", "show", "--customer", "cust-cap").exit_code == 2  # no budget was written
