"""Benchmark: the predictors on the demo's month.

    python -m bench.prediction [--requests N | --full-only] [--lookups 200000] [--json]

On an embedded PostgreSQL (or DATABASE_URL), the `infermeter demo --full` month (the whole Mooncake
trace, 36,093 requests in November 2026; `app.demo.month.generate`) is written through metering's write
path and billed like the demo (50 customers on the per-token book). Then:

1. hot path: `RequestModel.predict_request` (the lookup the gateway calls at admission) for request
   features drawn from the month (known and unknown customers, prefix seen or not, with and without
   max_tokens): CPU microseconds per prediction, best of 5 passes (target <= 10 us);
2. fit: `prediction_service.store.fit` on the month (history read from raw events, request cells, task
   sample, the state written): wall and CPU seconds, best of 3;
3. accuracy: `prediction_service.evaluate.evaluate` on the month, the `infermeter predict eval` table:
   MAE of p50 against the online median, pinball loss and coverage of p90 and p99, the cached fraction
   and failure scores, and the 80% spend interval's coverage at mid-period.

Gateway CPU per request with predictions on versus off (target <= 1.05x) is measured once the gateway
calls the predictor at admission: not yet, so the report says TODO instead of a number.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from infermeter.db import upgrade
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from metering.kafka import Message
from metering.writer import BatchWriter

MONTH = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
WRITER_NOW = datetime(2030, 1, 1, tzinfo=UTC)  # metering's clock: every event is in its past
GATEWAY_TODO = ("TODO: gateway CPU per request with predictions on vs off (target <= 1.05x) comes with the gateway's "
                "admission integration; not measured here")


def write_events(db_url: str, events: list[bytes], batch: int = 2000) -> None:
    """Events through metering's write path (BatchWriter), a group of its own (fresh offsets) each call."""
    writer = BatchWriter(to_libpq_url(db_url), group_id=f"prediction-{uuid.uuid4().hex[:8]}", max_bytes=65536,
                         future_tolerance_s=300, clock=lambda: WRITER_NOW)
    offsets = itertools.count()
    try:
        for i in range(0, len(events), batch):
            chunk = events[i:i + batch]
            result = writer.write([Message("events", 0, next(offsets), None, e, {}, None) for e in chunk])
            if result.accepted + result.duplicates != len(chunk):
                raise RuntimeError(f"metering refused events of the demo month: {result}")
    finally:
        writer.close()


def bill_like_the_demo(db_url: str) -> None:
    """The demo's billing set-up: 50 customers on the per-token book from 2026-11-01, cust-002 in
    Asia/Kolkata, cust-003 with prepaid credit; and `no-plan`, a customer without a plan."""
    from app.demo.bill import BILLING_SETUP_AT, NON_UTC_CUSTOMER, PREPAID_CUSTOMER
    from app.demo.month import CUSTOMERS
    from billing_service.credits import grant_credits
    from billing_service.customers import assign_plan, set_customer
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        for k in range(1, CUSTOMERS + 1):
            customer = f"cust-{k:03d}"
            zone = NON_UTC_CUSTOMER[1] if customer == NON_UTC_CUSTOMER[0] else None
            set_customer(conn, customer, now=BILLING_SETUP_AT, name=f"Demo customer {k}", timezone=zone)
            assign_plan(conn, customer, book.read_text(), str(book), "2026-11-01", now=BILLING_SETUP_AT)
            if customer == PREPAID_CUSTOMER[0]:
                grant_credits(conn, customer, PREPAID_CUSTOMER[1], now=BILLING_SETUP_AT, reason="demo top-up")
        set_customer(conn, "no-plan", now=BILLING_SETUP_AT, name="A customer without a plan")
        conn.execute("ANALYZE")


def load_demo_month(db_url: str, limit: int | None, seed: int = 7) -> list[bytes]:
    """The demo month of `limit` trace requests (None: the whole trace, `--full`), metered and billed."""
    from app.demo.month import generate

    events, _, _ = generate(limit, seed)
    write_events(db_url, events)
    bill_like_the_demo(db_url)
    return events


def hot_path(model, features, passes: int = 5) -> float:
    """CPU microseconds per predict_request, best of `passes`."""
    best = float("inf")
    predict = model.predict_request
    for _ in range(passes):
        t = time.process_time()
        for f in features:
            predict(f)
        best = min(best, time.process_time() - t)
    return best / len(features) * 1e6


def lookup_features(observations, n: int, seed: int = 1) -> list:
    from prediction.request import RequestFeatures

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = observations[rng.randrange(len(observations))]
        customer = r.customer_id if rng.random() < 0.9 else "new-customer"
        out.append(RequestFeatures(customer, r.model, r.input_tokens, rng.choice([None, None, 256, 4096]), r.task_id,
                                   r.attempt, rng.choice([None, True, False])))
    return out


def run(url: str, limit: int | None, lookups: int) -> dict:
    from prediction_service import history, store
    from prediction_service.evaluate import evaluate
    from pricing_service.books import read_cost_model

    t0 = time.perf_counter()
    events = load_demo_month(url, limit)
    loaded_s = time.perf_counter() - t0
    with psycopg.connect(to_libpq_url(url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        observations = history.requests(conn, *MONTH)
        fits = []
        for _ in range(3):
            wall, cpu = time.perf_counter(), time.process_time()
            with conn.transaction(force_rollback=True):
                info = store.fit(conn, *MONTH, now=datetime.now(UTC), trigger="cli")
            fits.append((time.perf_counter() - wall, time.process_time() - cpu))
        info = store.fit(conn, *MONTH, now=datetime.now(UTC), trigger="cli")
        conn.commit()
        fitted = store.latest(conn)
        features = lookup_features(observations, lookups)
        lookup_us = hot_path(fitted.requests, features)
        t = time.perf_counter()
        accuracy = evaluate(conn, *MONTH, cost_model=read_cost_model(None))
        eval_s = time.perf_counter() - t
    best = min(fits)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"), "loadavg": Path("/proc/loadavg").read_text().strip(),
        "month": {"events": len(events), "requests": info.requests, "tasks": info.tasks,
                  "request_cells": fitted.requests.cells, "load_s": round(loaded_s, 1)},
        "hot_path": {"lookups": len(features), "cpu_us_per_prediction": round(lookup_us, 3), "target_us": 10},
        "fit": {"wall_s": round(best[0], 3), "cpu_s": round(best[1], 3), "runs": len(fits)},
        "eval": {"wall_s": round(eval_s, 1), "all": accuracy["all"],
                 "spend": {k: accuracy["spend"][k] for k in ("periods", "inside", "coverage")}},
        "gateway": GATEWAY_TODO,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=None,
                        help="the month from the first N trace requests (default: the whole trace, as demo --full)")
    parser.add_argument("--lookups", type=int, default=200_000, help="hot-path predictions timed per pass")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-prediction-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    try:
        upgrade(url)
        report = run(url, args.requests, args.lookups)
    finally:
        if folder is not None:
            remove_scratch(folder)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    m, h, f, e = report["month"], report["hot_path"], report["fit"], report["eval"]
    a = e["all"]
    print(f"{report['date']}, load {report['loadavg']}")
    print(f"month: {m['requests']:,} requests, {m['tasks']:,} tasks, {m['request_cells']:,} request cells")
    print(f"hot path: {h['cpu_us_per_prediction']:.2f} us CPU per prediction (target <= {h['target_us']} us)")
    print(f"fit: {f['wall_s']:.2f} s wall, {f['cpu_s']:.2f} s CPU (best of {f['runs']})")
    print(f"eval ({e['wall_s']:.0f} s): MAE p50 {a['mae_p50']:.1f} (online median {a['baseline_mae_p50']:.1f}); "
          f"pinball p90 {a['pinball_p90']:.2f}, p99 {a['pinball_p99']:.2f}; coverage p90 {a['coverage_p90']:.1%}, "
          f"p99 {a['coverage_p99']:.1%}; cached fraction MAE {a['cached_fraction_mae']:.3f}; failure Brier "
          f"{a['failure_brier']:.4f}")
    s = e["spend"]
    print(f"spend at mid-period: {s['inside']} of {s['periods']} customer-periods inside the 80% interval "
          f"({s['coverage']:.0%})")
    print(report["gateway"])


if __name__ == "__main__":
    main()
