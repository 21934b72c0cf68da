"""Child process of the rate-limit test: a gateway process admitting requests through Postgres.

usage: python -m tests.serving_control.admit_child DB_URL CUSTOMER NOW_ISO COUNT PROMPT MAX_TOKENS START_AT
Waits until unix time START_AT (both processes start together), admits COUNT requests from
8 threads at the fixed time NOW_ISO, prints 'admitted=<n> reasons=<sorted reasons>'.
"""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import create_engine

from infermeter.settings import Settings
from serving.budgets import AdmissionController, Admitted


def main() -> None:
    db_url, customer, now_iso, count, prompt, max_tokens, start_at = sys.argv[1:8]
    now = datetime.fromisoformat(now_iso)
    engine = create_engine(db_url, pool_size=8)
    ctl = AdmissionController(engine, Settings(DATABASE_URL=db_url), clock=lambda: now)
    time.sleep(max(0.0, float(start_at) - time.time()))

    def one(_: int):
        return ctl.admit_sync(customer, model="tiny", request_id=uuid.uuid4().hex,
                              prompt_tokens=int(prompt), max_tokens=int(max_tokens), now=now)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(int(count))))
    admitted = sum(isinstance(r, Admitted) for r in results)
    reasons = sorted({r.reason for r in results if not isinstance(r, Admitted)})
    print(f"admitted={admitted} reasons={','.join(reasons)}", flush=True)


if __name__ == "__main__":
    main()
