"""The layers hold: import-linter's contracts (pyproject.toml) pass, and they do catch a violation."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
# What serving may import of metering; every other metering module must be in the serving contract.
METERING_PUBLIC = {"metering.contract", "metering.queries", "metering.task_reads", "metering.budget_reads",
                   "metering.ops_reads", "metering.event_lookups", "metering.kafka",
                   "metering.kafka_types", "metering.kafka_backends", "metering.schemas", "metering.spool",
                   "metering.intake", "metering.event_identity", "metering.publisher", "metering.confirmer"}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_metering_module_is_public_or_internal():
    serving = next(c for c in CONFIG["contracts"] if c["id"] == "serving")
    internal = {m for m in serving["forbidden_modules"] if m.startswith("metering.")}
    modules = {f"metering.{p.stem}" for p in (ROOT / "metering").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert modules == METERING_PUBLIC | internal, "classify new metering modules in pyproject.toml"


@pytest.mark.parametrize(("path", "line", "verdict"), [
    ("pricing/violation.py", "import sqlalchemy\n", "pricing is not allowed to import sqlalchemy"),
    ("infermeter/violation.py", "import metering.contract\n", "infermeter is not allowed to import metering"),
    ("serving/violation.py", "import metering.writer\n", "serving is not allowed to import metering.writer"),
    ("metering/violation.py", "from app import cli\n", "metering is not allowed to import app"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, path, line, verdict):
    copy = tmp_path / "tree"
    copy.mkdir()
    for name in [*CONFIG["root_packages"], "pyproject.toml"]:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "schemas"))
        else:
            shutil.copy(source, copy / name)
    (copy / path).write_text(line)
    result = lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict in result.stdout, result.stdout


# Metering owns its tables: SQL naming one of them (FROM, JOIN, INTO, UPDATE, ...) lives in metering/,
# or in migrations/ (which create them); tests/ and bench/ set up and measure. Any other directory of
# the project, present or future, is scanned (metering's reads for others: metering/queries.py,
# metering/period_reads.py and the other metering/*_reads.py).
NOT_SCANNED = {"metering", "migrations", "tests", "bench"}


def _metering_tables() -> list[str]:
    from sqlalchemy import Table

    import metering.tables

    mine = {v.name for v in vars(metering.tables).values() if isinstance(v, Table)}
    return [t.name for t in metering.tables.metadata.sorted_tables if t.name in mine]


def _project_sources() -> list[Path]:
    def skipped(part: str) -> bool:
        return part.startswith(".") or part in {"__pycache__", "node_modules", "build", "dist"} or part.endswith(
            ".egg-info")

    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(skipped(part) for part in p.relative_to(ROOT).parts[:-1])
                  and p.relative_to(ROOT).parts[0] not in NOT_SCANNED)


def test_no_sql_on_metering_tables_outside_metering():
    import re

    tables = _metering_tables()
    assert {"raw_events", "request_rollup_hourly", "gpu_ledger_hourly", "consumer_offsets"} <= set(tables)
    clause = re.compile(
        r"\b(?:FROM|JOIN|INTO|UPDATE|TRUNCATE|COPY)\s+(?:TABLE\s+)?(?:ONLY\s+)?(?:\w+\.)?(" + "|".join(tables) + r")\b"
    )
    sample = 'x = """\nSELECT 1\nFROM\n    request_rollup_hourly r LEFT JOIN public.task_usage u"""\ncur.execute("INSERT INTO raw_events ...")'
    assert [m.group(1) for m in clause.finditer(sample)] == ["request_rollup_hourly", "task_usage", "raw_events"]
    sources = _project_sources()
    assert any(p.parts[-2:] == ("pricing_service", "rate_period.py") for p in sources)  # the scan sees the code
    found = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for match in clause.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0).split()[0]} {match.group(1)}")
    assert not found, "SQL on metering's tables outside metering/ (read them through metering):\n" + "\n".join(found)
