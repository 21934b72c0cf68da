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

4. gateway: the gateway's CPU per request with predictions on versus off (target <= 1.05x), in the
   same run: the gateway app (`serving.gateway.create_app`: auth, body checks, admission's
   prediction, routing, proxying over its keep-alive pool, the request's event built with its
   `prediction` and encoded as the emitter encodes it) is called in this process, `--gateway-concurrency` requests at a
   time, with chat requests of the month's customers against a stub upstream in its own process
   (bench.gateway's), for `--gateway-seconds` in blocks of 20 ms, three modes a round in a seeded random
   order: with the fitted table held by its `AdmissionPredictor` ("on"), without a predictor ("off"),
   and without one again ("off again", the A/A: what the method cannot tell apart). CPU of this
   process (the stub's is apart) per request in each mode over all its blocks; the ratio is on / off,
   printed with the A/A and whether the target is met. Short blocks in random order spread the
   machine's load over the modes alike (0.25 s blocks alternated on, off, off, on measured A/A
   0.95-1.08x on the shared machine; these measure 0.99-1.02x).
   Without the emitter's spool write and Kafka (their cost is the same either way) the ratio errs
   high. The prediction's own cost (the lookup and the event's object) is timed apart too.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg

from infermeter.db import upgrade
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from metering.kafka import Message
from metering.writer import BatchWriter

MONTH = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
WRITER_NOW = datetime(2030, 1, 1, tzinfo=UTC)  # metering's clock: every event is in its past
GATEWAY_TARGET = 1.05  # gateway CPU per request, predictions on / off


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


class EncodingSink:
    """The gateway's event sink in the bench: encodes each event as the emitter does before its spool
    write (`metering.contract.encode_event`) and keeps only the last one, so that the events' bytes
    are paid for and no retained events grow the heap."""

    def __init__(self) -> None:
        from metering.contract import encode_event

        self._encode = encode_event
        self.last: dict | None = None
        self.emitted = 0

    def emit(self, event: dict) -> None:
        self._encode(event)
        self.last = event
        self.emitted += 1


class EmitterSink:
    """The gateway's own emitter (intake, SQLite spool, publisher thread, librdkafka) publishing to a
    Tansu broker of the run, broker acknowledgement: what `infermeter serve gateway` keeps each
    event with. Its threads run in this process, so their CPU is counted with the gateway's."""

    def __init__(self, spool_dir: Path, settings) -> None:
        from infermeter.stack.broker import start_tansu
        from serving.emitter import Emitter

        self.broker = start_tansu()
        self.emitter = Emitter(spool_dir, self.broker.bootstrap, settings, name="bench-prediction", ack="broker").start()
        self.last: dict | None = None

    def emit(self, event: dict) -> None:
        self.emitter.emit(event)
        self.last = event

    def emit_batched(self, event: dict) -> None:
        self.emitter.emit_batched(event)
        self.last = event

    def close(self) -> None:
        try:
            self.emitter.close()
        finally:
            self.broker.stop()


def gateway_cpu(version: int, table, observations, *, seconds: float, concurrency: int = 8,
                block_s: float = 0.02, sink_kind: str = "emitter") -> dict:
    """The gateway's CPU per request with predictions on (the fit `version`'s `table`) and off, in
    alternating blocks of one run (see the module doc, 4)."""
    import asyncio
    import multiprocessing

    import uvloop

    from bench.gateway import STUB_MODEL, _wait_http, run_stub
    from infermeter.settings import Settings
    from infermeter.stack.ports import free_port
    from serving.gateway import create_app
    from serving.predictions import AdmissionPredictor
    from serving.upstream_http import UpstreamPool
    from serving.upstreams import parse_upstreams

    model = table.models()[0]
    customers = sorted({o.customer_id for o in observations if o.model == model})
    port = free_port()
    stub = multiprocessing.get_context("spawn").Process(target=run_stub, args=(port,), daemon=True)
    stub.start()
    home = Path(tempfile.mkdtemp(prefix="bench-prediction-gw-"))
    sink = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", timeout_s=60)
        settings = Settings(INFERMETER_HOME=home)
        upstreams = parse_upstreams({"models": [{"name": model, "deployment_id": "bench", "upstream_model": STUB_MODEL,
                                                 "replicas": [{"id": "stub-0", "url": f"http://127.0.0.1:{port}"}]}]})
        sink = EmitterSink(home / "spool", settings) if sink_kind == "emitter" else EncodingSink()
        app = create_app(settings, upstreams=upstreams, sink=sink)
        state = app.gateway
        predictor = AdmissionPredictor(lambda _newer_than: None)
        predictor.held = (version, table)
        auth = f"Bearer {settings.admin_token}".encode()
        rng = random.Random(3)
        requests = []
        for i in range(512):
            body = orjson.dumps({"model": model, "max_tokens": 256,
                                 "messages": [{"role": "user", "content": "Summarise the ledger. " * rng.randint(1, 40)}]})
            headers = [(b"authorization", auth), (b"content-type", b"application/json"),
                       (b"x-infermeter-customer-id", customers[i % len(customers)].encode()),
                       (b"content-length", str(len(body)).encode())]
            requests.append((headers, body))
        modes = {"on": predictor, "off": None, "off again": None}
        blocks: dict[str, list[tuple[float, int]]] = {mode: [] for mode in modes}  # (CPU s, requests) per block
        statuses: dict[int, int] = {}

        async def one(headers, body) -> None:
            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
                     "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
                     "http_version": "1.1", "root_path": ""}
            sent = False

            async def receive():
                nonlocal sent
                if sent:
                    await asyncio.sleep(3600)
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses[message["status"]] = statuses.get(message["status"], 0) + 1

            await app(scope, receive, send)

        async def block(mode: str) -> None:
            state.predictor = modes[mode]
            next_request = itertools.count()
            stop_at = time.perf_counter() + block_s

            async def worker() -> int:
                done = 0
                while time.perf_counter() < stop_at:
                    await one(*requests[next(next_request) % len(requests)])
                    done += 1
                return done

            cpu = time.process_time()
            done = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
            blocks[mode].append((time.process_time() - cpu, done))

        async def main() -> None:
            state.upstream = UpstreamPool(connect_timeout_s=5, read_timeout_s=30)
            gc.collect()
            gc.freeze()  # as the gateway's lifespan does: what lives for the process is out of the cyclic GC
            try:
                await block("off")  # warm-up: connections, caches
                blocks["off"].clear()
                statuses.clear()
                order, shuffle = list(modes), random.Random(5).shuffle
                for _ in range(max(4, round(seconds / block_s / len(modes)))):
                    shuffle(order)  # no drift of the machine's load favours a mode
                    for mode in order:
                        await block(mode)
                state.predictor = predictor
                await one(*requests[0])  # its event carries the prediction (checked below)
            finally:
                await state.upstream.close()

        uvloop.run(main())
        if statuses != {200: sum(statuses.values())} or "prediction" not in sink.last["data"]:
            raise RuntimeError(f"the gateway bench did not serve as expected: statuses {statuses}, "
                               f"last event {sink.last}")
    finally:
        if sink is not None and hasattr(sink, "close"):
            sink.close()
        stub.terminate()
        stub.join(10)
        remove_scratch(home)
    # per mode: CPU per request over all its blocks; the ratio on / off, the A/A off again / off
    per = {mode: sum(cpu for cpu, _ in rows) / sum(n for _, n in rows) * 1e6 for mode, rows in blocks.items()}
    ratio = per["on"] / per["off"]
    return {"model": model, "concurrency": concurrency, "seconds": seconds, "block_s": block_s, "sink": sink_kind,
            "requests": {mode: sum(n for _, n in rows) for mode, rows in blocks.items()},
            "cpu_us_per_request": {mode: round(v, 1) for mode, v in per.items()},
            "prediction_us_per_request": round(own := prediction_cost(predictor, customers, model), 2),
            "prediction_share": round(own / per["off"], 4), "a_a": round(per["off again"] / per["off"], 3),
            "ratio": round(ratio, 3), "target": GATEWAY_TARGET, "met": ratio <= GATEWAY_TARGET}


def prediction_cost(predictor, customers: list[str], model: str, n: int = 50_000) -> float:
    """CPU microseconds of what predictions add to a request, timed apart: the lookup at admission
    and the event's `prediction` object (best of 3)."""
    best = float("inf")
    rows = [(customers[i % len(customers)], 200 + 37 * i % 3000) for i in range(n)]
    for _ in range(3):
        t = time.process_time()
        for customer, prompt in rows:
            predictor.predict(customer, model, prompt, 256).to_event()
        best = min(best, time.process_time() - t)
    return best / n * 1e6


def run(url: str, limit: int | None, lookups: int, gateway_seconds: float = 4.0, gateway_concurrency: int = 8,
        gateway_sink: str = "emitter") -> dict:
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
        "gateway": gateway_cpu(info.version, fitted.requests, observations, seconds=gateway_seconds,
                               concurrency=gateway_concurrency, sink_kind=gateway_sink),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=None,
                        help="the month from the first N trace requests (default: the whole trace, as demo --full)")
    parser.add_argument("--lookups", type=int, default=200_000, help="hot-path predictions timed per pass")
    parser.add_argument("--gateway-seconds", type=float, default=4.0,
                        help="the gateway's on/off measure: seconds in all (alternating 0.25 s blocks)")
    parser.add_argument("--gateway-concurrency", type=int, default=8, help="the gateway's requests at a time")
    parser.add_argument("--gateway-sink", choices=("emitter", "encode"), default="emitter",
                        help="the gateway's events kept by its emitter and a Tansu broker (as served), or only encoded")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-prediction-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    try:
        upgrade(url)
        report = run(url, args.requests, args.lookups, args.gateway_seconds, args.gateway_concurrency, args.gateway_sink)
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
    g = report["gateway"]
    print(f"gateway CPU per request (c={g['concurrency']}, events {'kept by the emitter' if g['sink'] == 'emitter' else 'only encoded'}, {g['requests']['on']:,} + {g['requests']['off']:,} "
          f"requests): {g['cpu_us_per_request']['on']:.1f} us with predictions, {g['cpu_us_per_request']['off']:.1f} us "
          f"without: {g['ratio']:.3f}x (target <= {g['target']}x): {'met' if g['met'] else 'NOT met'}; A/A (without, "
          f"again / without) {g['a_a']:.3f}x; the prediction's "
          f"own cost timed apart: {g['prediction_us_per_request']:.2f} us a request, {g['prediction_share']:.1%} of the "
          "gateway's CPU without")


if __name__ == "__main__":
    main()
