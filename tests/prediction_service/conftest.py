"""Fixtures for prediction_service: the demo's month (the bundled Mooncake trace as events, app.demo.month)
written through metering's real write path into its own database, with the demo's billing set-up
(50 customers on the per-token book, cust-002 in Asia/Kolkata, cust-003 with prepaid credit); the CLI
and the HTTP app on it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import pytest

from bench.prediction import load_demo_month
from infermeter.stack.postgres import to_libpq_url
from tests.cli_in_process import CliResult, run_cli
from tests.conftest import new_database

MONTH = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
QUOTE_AT = datetime(2026, 11, 20, tzinfo=UTC)


@dataclass
class DemoMonth:
    url: str
    events: list[bytes]


@pytest.fixture(scope="session")
def demo_month(pg_server_url) -> DemoMonth:
    """The default demo month (4,000 trace requests, 12,000 in the month, seed 7), metered and billed."""
    url = new_database(pg_server_url)
    return DemoMonth(url, load_demo_month(url, 4000))


@pytest.fixture
def demo_conn(demo_month):
    """A connection to the demo month; what a test writes (a fit) is rolled back."""
    with psycopg.connect(to_libpq_url(demo_month.url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn
        conn.rollback()




@pytest.fixture
def cli(monkeypatch, capsys, tmp_path):
    """`infermeter ...` through app.cli.main on a database: cli(url, "predict", "status")."""
    from infermeter.settings import get_settings

    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))

    def invoke(url: str, *args: str) -> CliResult:
        monkeypatch.setenv("DATABASE_URL", url)
        get_settings.cache_clear()
        return run_cli(monkeypatch, capsys, *args)

    yield invoke
    get_settings.cache_clear()
