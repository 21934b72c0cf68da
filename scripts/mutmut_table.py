"""The mutation-testing table of docs/testing.md: `mutmut results --all true` counted by module file
(killed / survived / timeout / no tests / any other status / total) and the score.

    .venv/bin/python scripts/mutmut_table.py
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter, defaultdict

COLUMNS = ["killed", "survived", "timeout", "no tests"]


def module_of(mutant: str) -> str:
    """billing.invoice.xǁInvoiceǁ__post_init____mutmut_3 -> billing/invoice/__init__.py"""
    parts = mutant.split(".")
    i = next(k for k, p in enumerate(parts) if p.startswith(("x_", "xǁ")))
    path = "/".join(parts[:i])
    return path + ".py" if os.path.exists(path + ".py") else path + "/__init__.py"


def main() -> None:
    out = subprocess.run([".venv/bin/mutmut", "results", "--all", "true"], capture_output=True, text=True,
                         check=True).stdout
    by_module: dict[str, Counter] = defaultdict(Counter)
    for line in out.splitlines():
        m = re.match(r"\s*(\S+?)__mutmut_\d+: (.+)$", line)
        if m:
            by_module[module_of(m.group(1))][m.group(2)] += 1
    others = sorted({s for c in by_module.values() for s in c} - set(COLUMNS))
    columns = COLUMNS + others
    print("| module | " + " | ".join(columns) + " | total |")
    print("| --- |" + " ---: |" * (len(columns) + 1))
    total: Counter = Counter()
    for module in sorted(by_module):
        c = by_module[module]
        total += c
        print(f"| `{module}` | " + " | ".join(str(c[s]) for s in columns) + f" | {c.total()} |")
    print("| **all** | " + " | ".join(str(total[s]) for s in columns) + f" | {total.total()} |")
    run = total["killed"] + total["survived"] + total["timeout"] + total["no tests"]
    print(f"\nkilled {total['killed']} of {run} run ({100 * total['killed'] / run:.1f}%), "
          f"{total.total() - run} not run")


if __name__ == "__main__":
    main()
