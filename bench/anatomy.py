"""Benchmark: `infermeter cost anatomy` for a month against the cost model alone, in the same run
(target: the anatomy in <= 2x the cost model's time).

    python -m bench.anatomy [--customers 10000] [--models 5] [--active-hours 72] [--replicas 8] [--repeat 3]
                            [--raw-events N]

Data: bench.rating's month (10k customers x 5 models, each active in 72 of November 2026's 720 hours:
3.6M request_rollup_hourly rows on the shared-pool deployment `dep-a`), plus its GPU ledger: `--replicas`
H100 replicas of `dep-a` every hour (gpu_ledger_hourly rows with wall time, busy time, KV-cache
memory-time, request-ms waiting and running, as the replica agent's intervals roll up), in a real
PostgreSQL (DATABASE_URL, else a fresh embedded one in a temporary folder, removed at the end).
With `--raw-events N`, also N raw request events (raw_events, November's partition) spread over the
month's customer x model x hour shares: 90% ok, 3% error, 2% cancelled, 1% rejected, 2% whose prefix
was seen and missed the cache, 2% served after a failover. The anatomy classifies requests from the
raw events (metering.anatomy_reads.request_classes); bench.rating's month has none, so without this
flag every share is new compute and that read is empty.

- the cost model alone: `pricing_service.source.load_dataset` + `pricing.cost.attribute` (what
  `pricing compare` computes its cost with), and the total rounded to the cent;
- the anatomy: `pricing_service.anatomy.cost_anatomy` (the same load and attribution, the GPU ledger's
  engine state, the raw request events' classes, the five terms, to the cent), grouped by customer.

Both give the same total (checked). Best of `--repeat` runs of each, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
from rich.console import Console

from bench.rating import END, HOURS, START, generate
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url
from pricing.anatomy import anatomy, parts
from pricing.cost import attribute
from pricing.money import Currency
from pricing_service.anatomy import cost_anatomy, gc_paused, load_anatomy_inputs
from pricing_service.books import EXAMPLE_BOOKS_DIR, read_cost_model
from pricing_service.source import connect, load_dataset


def generate_ledger(url: str, replicas: int) -> int:
    """`replicas` H100 replicas of dep-a in every hour of the month, with engine state."""
    with psycopg.connect(to_libpq_url(url)) as conn:
        conn.execute("TRUNCATE gpu_ledger_hourly")
        rows = 0
        with conn.cursor().copy(
            "COPY gpu_ledger_hourly (customer_id, deployment_id, replica_id, gpu_type, hour, gpu_ms, busy_ms, "
            "prompt_tokens, generation_tokens, intervals, wall_ms, kv_cache_gpu_ms, queue_ms, running_ms) FROM STDIN"
        ) as copy:
            for h in range(HOURS):
                hour = (START + timedelta(hours=h)).isoformat()
                lines = []
                for r in range(replicas):
                    busy = 1_800_000 + (h * 37 + r * 101) % 1_500_000  # 50-92% busy
                    kv = busy * (30 + (h + r) % 50) // 100
                    queue = (h * 13 + r * 7) % 400_000
                    running = busy * (2 + (h + r) % 6)
                    lines.append(f"\tdep-a\tdep-a-{r}\tH100\t{hour}\t3600000\t{busy}\t0\t0\t360\t3600000\t{kv}\t{queue}\t{running}\n")
                copy.write("".join(lines))
                rows += len(lines)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE gpu_ledger_hourly")
    return rows


def generate_raw_events(url: str, customers: int, models: int, active_hours: int, events: int) -> int:
    """`events` raw request events, one per share at an even stride over the month's active shares."""
    from bench.rating import MODELS

    step = HOURS // active_hours
    shares = customers * models * active_hours
    stride = max(1, shares // events)
    kinds = ["ok"] * 90 + ["error"] * 3 + ["cancelled"] * 2 + ["rejected"] + ["seen"] * 2 + ["failover"] * 2
    written = 0
    with psycopg.connect(to_libpq_url(url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_events_2026_11 PARTITION OF raw_events "
                     f"FOR VALUES FROM ('{START.isoformat()}') TO ('{END.isoformat()}')")
        conn.execute("TRUNCATE raw_events")
        with conn.cursor().copy(
            "COPY raw_events (occurred_at, source, event_id, type, customer_id, payload) FROM STDIN"
        ) as copy:
            index = 0
            for c in range(customers):
                for m in range(models):
                    offset = (c * 7 + m * 13) % step
                    for k in range(active_hours):
                        index += 1
                        if index % stride or written >= events:
                            continue
                        at = (START + timedelta(hours=offset + step * k, minutes=index % 60)).isoformat()
                        kind = kinds[written % len(kinds)]
                        inp = 900 + (c + k) % 700
                        data = {"request_id": f"r{written}", "customer_id": f"cust-{c:05d}", "model": MODELS[m],
                                "deployment_id": "dep-a", "replica_id": f"dep-a-{written % 8}",
                                "status": "ok" if kind in ("ok", "seen", "failover") else kind,
                                "input_tokens": inp, "cached_input_tokens": 0 if kind == "seen" else inp // 4,
                                "output_tokens": 0 if kind == "rejected" else 120 + c % 200, "attempt": 1,
                                "tags": {"error": "upstream_broken"} if kind == "error" else
                                        {"reason": "client_disconnected"} if kind == "cancelled" else {}}
                        if kind == "seen":
                            data.update(prefix_seen=True, prefix_seen_replica=f"dep-a-{(written + 1) % 8}")
                        if kind == "failover":
                            data["upstream_attempts"] = 2
                        payload = json.dumps({"type": "infermeter.request.v1", "data": data})
                        copy.write(f"{at}\t//bench/gw\tr{written}\tinfermeter.request.v1\tcust-{c:05d}\t"
                                   + payload.replace("\\", "\\\\") + "\n")
                        written += 1
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE raw_events")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--active-hours", type=int, default=72, help="active hours per customer x model (of 720)")
    parser.add_argument("--replicas", type=int, default=8, help="replicas of the deployment in the GPU ledger")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each side (best is reported)")
    parser.add_argument("--raw-events", type=int, default=0, help="raw request events to classify (default none)")
    args = parser.parse_args()
    console = Console()
    folder = None if os.environ.get("DATABASE_URL") else Path(tempfile.mkdtemp(prefix="bench-anatomy-"))
    url = os.environ.get("DATABASE_URL") or start_embedded_postgres(folder / "pg")
    try:
        t0 = time.perf_counter()
        rows = generate(url, args.customers, args.models, args.active_hours, console)
        ledger = generate_ledger(url, args.replicas)
        raw = generate_raw_events(url, args.customers, args.models, args.active_hours, args.raw_events) \
            if args.raw_events else 0
        console.print(f"generated {rows:,} hourly rollup rows, {ledger:,} GPU ledger rows and {raw:,} raw request "
                      f"events in {time.perf_counter() - t0:.1f} s")
        model = read_cost_model(EXAMPLE_BOOKS_DIR / "cost-model.yaml")
        currency = Currency.of(model.currency)
        costs, anatomies = [], []
        with connect(url) as conn:
            for _ in range(args.repeat):
                t = time.perf_counter()
                dataset = load_dataset(conn, START, END)
                cost = currency.round(attribute(dataset, model).total_cost)
                costs.append(time.perf_counter() - t)
                del dataset

                t = time.perf_counter()
                result = cost_anatomy(conn, START, END, model, group_by="customer")
                anatomies.append(time.perf_counter() - t)
            # where the anatomy's time goes: its steps, one by one (the same calls as cost_anatomy)
            phases = {}
            t = time.perf_counter()
            dataset = load_dataset(conn, START, END)
            phases["load"] = time.perf_counter() - t
            t = time.perf_counter()
            att = attribute(dataset, model)
            phases["attribute"] = time.perf_counter() - t
            t = time.perf_counter()
            inputs = load_anatomy_inputs(conn, START, END)
            phases[f"engine state + request classes ({len(inputs.classes):,} class rows)"] = time.perf_counter() - t
            t = time.perf_counter()
            with gc_paused():  # as cost_anatomy does
                all_parts = parts(dataset, model, inputs, att)
            phases[f"terms ({len(all_parts):,} parts)"] = time.perf_counter() - t
            t = time.perf_counter()
            with gc_paused():
                anatomy(all_parts, model.currency, group_by="customer")
            phases["rows to the cent"] = time.perf_counter() - t
            del dataset, att, all_parts
        assert result.total == cost, (result.total, cost)
        terms = {t: result.term(t) for t in ("new_compute", "context_not_reused", "cache_occupancy",
                                             "queue_and_idle", "failure")}
        console.print(f"cost of the month: {cost} {model.currency} over {len(result.rows):,} customer rows; "
                      + ", ".join(f"{k} {v}" for k, v in terms.items()))
        assert sum(terms.values(), Decimal(0)) == cost
        console.print("the same terms summed exactly, before each row is rounded to the cent: "
                      + ", ".join(f"{k} {currency.round(v)}" for k, v in result.exact.items()))
        best_cost, best_anatomy = min(costs), min(anatomies)
        console.print(f"cost model alone (load + attribute): {best_cost:.2f} s (best of {args.repeat}: "
                      + ", ".join(f"{t:.2f}" for t in costs) + ")")
        console.print(f"cost anatomy (load + attribute + engine state + request classes + terms): {best_anatomy:.2f} s "
                      f"(best of {args.repeat}: " + ", ".join(f"{t:.2f}" for t in anatomies) + ")")
        console.print("anatomy steps, one run: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        ratio = best_anatomy / best_cost
        verdict = "[green]within[/]" if ratio <= 2 else "[red]over[/]"
        console.print(f"ratio anatomy / cost model: [bold]{ratio:.2f}x[/] ({verdict} the 2x target)")
    finally:
        if folder is not None:
            remove_scratch(folder)


if __name__ == "__main__":
    main()
