"""Serving control-plane costs on the gateway's hot path, in one run.

    python -m bench.serving_control [--events 20000] [--admissions 2000] [--json]

Measures, with the embedded PostgreSQL and Tansu (or DATABASE_URL / KAFKA_BOOTSTRAP):
1. Emitter: `emit()` latency (p50/p99) with INFERMETER_SPOOL_SYNC=normal and =full, and the
   spool -> Kafka drain rate (events acknowledged per second, acks=all).
2. API keys: `authenticate` latency with a warm cache and with a cache miss (one PK lookup).
3. Admission: `admit` + `settle` latency for a customer with a budget and RPM/TPM (one
   locked transaction each), for a customer without limits (cached: no database), and the
   admissions per second of one limited customer with 16 concurrent threads (serialised by
   its row lock) versus 16 customers.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
from rich.console import Console
from sqlalchemy import create_engine, text

from infermeter.db import upgrade
from infermeter.settings import Settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.postgres import scratch_folder, start_embedded_postgres, to_libpq_url
from metering.contract import REQUEST_V1, make_event
from metering.kafka import ensure_topics

console = Console(stderr=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(samples: list[float]) -> dict:
    return {"p50_us": round(pct(samples, 0.5) * 1e6, 1), "p99_us": round(pct(samples, 0.99) * 1e6, 1)}


def event(i: int) -> dict:
    now = datetime.now(UTC)
    return make_event(REQUEST_V1, source="//bench/gw", subject=f"cust-{i % 16}", event_id=f"e{i}", data={
        "request_id": f"e{i}", "customer_id": f"cust-{i % 16}", "api_key_id": "k", "model": "tiny",
        "deployment_id": "dep", "replica_id": "r0", "status": "ok", "input_tokens": 812, "cached_input_tokens": 512,
        "output_tokens": 64, "task_id": None, "attempt": 1, "started_at": now, "first_token_at": now,
        "finished_at": now, "tags": {}})


def bench_emitter(settings: Settings, bootstrap: str, n: int, tmp: Path) -> dict:
    from serving.emitter import Emitter

    out = {}
    events = [event(i) for i in range(n)]
    for sync in ("normal", "full"):
        s = settings.model_copy(update={"spool_sync": sync})
        emitter = Emitter(tmp / f"spool-{sync}", bootstrap, s, name=f"bench-{sync}")  # not started: pure append
        count = n if sync == "normal" else min(n, 2000)
        lat = []
        for e in events[:count]:
            t = time.perf_counter()
            emitter.emit(e)
            lat.append(time.perf_counter() - t)
        out[f"emit_{sync}"] = us(lat)
        if sync == "normal":
            t = time.perf_counter()
            emitter.start()
            assert emitter.wait_drained(120), emitter.last_error
            out["drain_events_per_s"] = round(count / (time.perf_counter() - t))
            lat = []  # the publisher is running now: appends race its peeks and acks
            for e in events[:count]:
                t = time.perf_counter()
                emitter.emit(e)
                lat.append(time.perf_counter() - t)
                if len(lat) % 50 == 0:
                    time.sleep(0.001)  # a paced stream, like a gateway's requests, not one burst
            out["emit_normal_while_publishing"] = us(lat)
            assert emitter.wait_drained(120), emitter.last_error
        emitter.close()
    return out


def bench_keys(engine, settings: Settings) -> dict:
    from serving.keys import KeyStore

    store = KeyStore(engine, settings)
    _, token = store.create("bench-cust")
    store.authenticate_sync(token)
    warm = []
    for _ in range(5000):
        t = time.perf_counter()
        store.authenticate_sync(token)
        warm.append(time.perf_counter() - t)
    cold_store = KeyStore(engine, settings, cache_ttl_s=0)
    cold = []
    for _ in range(500):
        t = time.perf_counter()
        cold_store.authenticate_sync(token)
        cold.append(time.perf_counter() - t)
    return {"authenticate_cached": us(warm), "authenticate_db_lookup": us(cold)}


def bench_admission(engine, settings: Settings, n: int) -> dict:
    from serving.budgets import AdmissionController, Admitted, set_budget

    ctl = AdmissionController(engine, settings)
    set_budget(engine, "limited", monthly_cap=Decimal("1000000"), mode="hard", rpm=10**9, tpm=10**12)
    admit_lat, settle_lat = [], []
    for _ in range(n):
        rid = uuid.uuid4().hex
        t = time.perf_counter()
        result = ctl.admit_sync("limited", model="tiny", request_id=rid, prompt_tokens=800, max_tokens=64)
        admit_lat.append(time.perf_counter() - t)
        assert isinstance(result, Admitted)
        t = time.perf_counter()
        ctl.settle_sync(rid, input_tokens=800, cached_input_tokens=512, output_tokens=60, event_source="//bench",
                        event_id=rid)
        settle_lat.append(time.perf_counter() - t)
        # metering ingests the request's event shortly after (not timed): the settled row then
        # leaves the spend query at the next housekeeping, as in a running system
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO event_keys (source, event_id, occurred_at) VALUES ('//bench', :i, now())"),
                         {"i": rid})
        if len(settle_lat) % 100 == 0:
            ctl.housekeep("limited")
    free = []
    ctl.admit_sync("free", model="tiny", request_id="x", prompt_tokens=1, max_tokens=1)
    for _ in range(5000):
        t = time.perf_counter()
        ctl.admit_sync("free", model="tiny", request_id="x", prompt_tokens=1, max_tokens=1)
        free.append(time.perf_counter() - t)

    def rate(customers: list[str], per_thread: int) -> int:
        for c in customers:
            set_budget(engine, c, monthly_cap=Decimal("1000000"), mode="hard", rpm=10**9, tpm=10**12)
        barrier = threading.Barrier(16)

        def work(k: int) -> None:
            barrier.wait()
            for _ in range(per_thread):
                ctl.admit_sync(customers[k % len(customers)], model="tiny", request_id=uuid.uuid4().hex,
                               prompt_tokens=800, max_tokens=64)

        t = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(work, range(16)))
        return round(16 * per_thread / (time.perf_counter() - t))

    per_thread = max(10, n // 16)
    return {
        "admit_limited": us(admit_lat),
        "settle": us(settle_lat),
        "admit_unlimited_cached": us(free),
        "admits_per_s_one_customer_16_threads": rate(["hot"], per_thread),
        "admits_per_s_16_customers_16_threads": rate([f"c{i}" for i in range(16)], per_thread),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with scratch_folder("bench-serving-control-") as tmp:
        _run(args, tmp)


def _run(args: argparse.Namespace, tmp: Path) -> None:
    server = start_embedded_postgres(tmp / "pg")
    with psycopg.connect(to_libpq_url(server), autocommit=True) as conn:
        conn.execute("CREATE DATABASE bench_control")
    head, _, query = server.partition("?")
    url = head.rsplit("/", 1)[0] + "/bench_control" + (f"?{query}" if query else "")
    upgrade(url, "heads")
    broker = start_tansu(log_path=tmp / "tansu.log")
    try:
        settings = Settings(INFERMETER_HOME=tmp, DATABASE_URL=url, KAFKA_BOOTSTRAP=broker.bootstrap,
                            INFERMETER_TOPIC_PREFIX=f"bench{uuid.uuid4().hex[:6]}")
        ensure_topics(broker.bootstrap, settings)
        engine = create_engine(url, pool_size=20, max_overflow=10)
        results = {}
        console.print("emitter ...")
        results["emitter"] = bench_emitter(settings, broker.bootstrap, args.events, tmp)
        console.print("keys ...")
        results["keys"] = bench_keys(engine, settings)
        console.print("admission ...")
        results["admission"] = bench_admission(engine, settings, args.admissions)
        engine.dispose()
    finally:
        broker.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for area, values in results.items():
            for name, value in values.items():
                print(f"{area:10} {name:40} {value}")


if __name__ == "__main__":
    main()
