"""Price books stored with effective dates; rating a period uses the version in force at its start."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from typer.testing import CliRunner

from infermeter.settings import get_settings
from pricing_service.books import book_in_force, import_book, list_versions
from pricing_service.cli import app
from pricing_service.compare import run_comparison
from pricing_service.source import connect
from tests.pricing_service.conftest import H0, H2

V1 = 'id: tasks\ncurrency: USD\ncharges:\n  - meter: successful_tasks\n    price: {type: unit, amount: "1.00", per: 1}\n'
V2 = V1.replace('"1.00"', '"2.00"')
NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def test_versions_and_effective_dates(synthetic_db, tmp_path):
    (tmp_path / "v1.yaml").write_text(V1)
    (tmp_path / "v2.yaml").write_text(V2)
    with connect(synthetic_db) as conn:
        assert import_book(conn, tmp_path / "v1.yaml", NOV)[1] is True
        assert import_book(conn, tmp_path / "v1.yaml", NOV)[1] is False  # same text again: no-op
        with pytest.raises(ValueError, match="already has a different version"):
            import_book(conn, tmp_path / "v2.yaml", NOV)
        import_book(conn, tmp_path / "v2.yaml", DEC)
        assert [v.effective_from for v in list_versions(conn)] == [NOV, DEC]
        assert book_in_force(conn, "tasks", datetime(2026, 10, 31, tzinfo=UTC)) is None
        assert book_in_force(conn, "tasks", H0).charges[0].price.amount == Decimal("1.00")
        assert book_in_force(conn, "tasks", DEC).charges[0].price.amount == Decimal("2.00")
    report = run_comparison(synthetic_db, H0, H2, ["stored:tasks"])
    assert report.to_json()["books"][0]["revenue"] == "3.00"  # 3 successful tasks at the November price


def test_cli_import_and_list(synthetic_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", synthetic_db)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        (tmp_path / "v1.yaml").write_text(V1)
        runner = CliRunner()
        ok = runner.invoke(app, ["books", "import", str(tmp_path / "v1.yaml"), "--effective-from", "2026-11-01T00:00:00Z"])
        assert ok.exit_code == 0, ok.output
        assert "tasks effective from 2026-11-01T00:00:00+00:00: stored" in ok.stdout
        listed = runner.invoke(app, ["books", "list"])
        assert listed.exit_code == 0 and "tasks" in listed.stdout
        (tmp_path / "bad.yaml").write_text(V1.replace("USD", "XXX"))
        bad = runner.invoke(app, ["books", "import", str(tmp_path / "bad.yaml"), "--effective-from", "2026-11-01T00:00:00Z"])
        assert bad.exit_code == 2 and "unknown currency 'XXX'" in bad.output
    finally:
        get_settings.cache_clear()
