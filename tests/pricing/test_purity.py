"""pricing/ is pure: none of its modules imports an I/O library."""

from __future__ import annotations

import ast
from pathlib import Path

import pricing
from infermeter.db import QUANTITY_SCALE, Quantity
from pricing.money import PRECISION, SCALE

FORBIDDEN = {
    "sqlalchemy", "psycopg", "psycopg2", "asyncpg", "alembic", "confluent_kafka", "kafka", "aiokafka",
    "stripe", "fastapi", "starlette", "uvicorn", "httpx", "requests", "aiohttp", "urllib", "http",
    "socket", "infermeter", "metering", "billing", "serving", "dashboards", "pricing_service", "typer",
    "subprocess", "sqlite3", "smtplib",
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            roots.add("__import__")
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            roots.add("importlib.import_module")
    return roots


def test_pricing_modules_import_no_io_library():
    modules = sorted(Path(pricing.__file__).parent.rglob("*.py"))
    assert len(modules) >= 5
    offenders = {
        str(m.relative_to(Path(pricing.__file__).parent)): sorted(imported_roots(m) & (FORBIDDEN | {"__import__", "importlib.import_module"}))
        for m in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_scale_matches_the_database():
    assert SCALE == QUANTITY_SCALE
    assert (PRECISION, SCALE) == (Quantity.precision, Quantity.scale)
