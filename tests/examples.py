"""How many examples a Hypothesis property of the pure domains tries.

`examples(n)`: the property's own count in every test run; a tenth of it (at least 10) while mutmut
runs a mutant (it sets `MUTANT_UNDER_TEST`), so the 5,000-odd mutants of `billing/` and `pricing/`
run in about an hour on one core instead of several. A mutant killed with fewer examples is killed;
one that survives them may still be killed by the full count, so the mutation score this gives is a
lower bound (docs/testing.md, "Mutation testing").
"""

from __future__ import annotations

import os

MUTATION_SHARE = 10  # under mutmut, a property tries this many times fewer examples
LEAST = 10


def examples(n: int) -> int:
    return max(LEAST, n // MUTATION_SHARE) if os.environ.get("MUTANT_UNDER_TEST") else n
