"""Child process of the kill -9 test: emit N events through an Emitter, say so, then wait to be killed.

usage: python -m tests.serving_control.emit_child SPOOL_DIR BOOTSTRAP TOPIC_PREFIX NAME FIRST COUNT
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from infermeter.settings import Settings
from metering.contract import REQUEST_V1, make_event
from serving.emitter import Emitter


def request_event(i: int) -> dict:
    now = datetime.now(UTC)
    customer = f"cust-{i % 7}"
    return make_event(
        REQUEST_V1,
        source="//gateway/test-child",
        subject=customer,
        event_id=f"req-{i}",
        data={
            "request_id": f"req-{i}", "customer_id": customer, "api_key_id": "k1", "model": "tiny",
            "deployment_id": "dep", "replica_id": "r0", "status": "ok", "input_tokens": 10 + i % 5,
            "cached_input_tokens": 0, "output_tokens": 3, "task_id": None, "attempt": 1,
            "started_at": now, "first_token_at": now, "finished_at": now, "tags": {},
        },
    )


def main() -> None:
    spool_dir, bootstrap, prefix, name, first, count = sys.argv[1:7]
    settings = Settings(INFERMETER_TOPIC_PREFIX=prefix, KAFKA_BOOTSTRAP=bootstrap)
    emitter = Emitter(Path(spool_dir), bootstrap, settings, name=name).start()
    for i in range(int(first), int(first) + int(count)):
        emitter.emit(request_event(i))
    print("emitted", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
