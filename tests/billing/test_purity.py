"""billing/ is pure: none of its modules imports an I/O library, or any project package but pricing
and the ground's time module (infermeter.times; import-linter's contract keeps the rest of the ground out)."""

from __future__ import annotations

from pathlib import Path

import billing
from tests.pricing.test_purity import FORBIDDEN, imported_roots

PROJECT = {"metering", "serving", "dashboards", "pricing_service", "migrations", "bench", "scripts"}
IO = FORBIDDEN - {"billing", "infermeter"} | {"pyarrow", "boto3", "botocore", "redis", "psycopg_pool", "os", "shutil", "pathlib",
                                 "io", "tempfile", "time", "random", "uuid", "logging", "yaml"}


def test_billing_modules_import_no_io_library():
    root = Path(billing.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert {str(m.relative_to(root)) for m in modules} >= {
        "__init__.py", "periods.py", "invoice/__init__.py", "invoice/drafts.py", "invoice/states.py",
        "invoice/adjustments.py", "credits.py", "numbering.py", "stripe_keys.py"}
    offenders = {
        str(m.relative_to(root)): sorted(imported_roots(m) & (IO | PROJECT | {"__import__", "importlib.import_module"}))
        for m in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_billing_imports_only_pricing_of_the_project():
    root = Path(billing.__file__).parent
    used = set().union(*(imported_roots(m) for m in root.rglob("*.py")))
    assert used & {"pricing", "billing"} == {"pricing", "billing"}
    assert not used & PROJECT
