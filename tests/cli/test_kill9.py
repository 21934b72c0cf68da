"""`kill -9` of `infermeter up` while events arrive loses nothing and doubles nothing.

The real embedded stack (PostgreSQL, memory-only Tansu, metering, API), `infermeter events ingest`
in a subprocess and `infermeter serve gateway` in front of a stub OpenAI upstream (bench.gateway's,
no vLLM) under steady load. Each run ingests a file of EVENTS_PER_RUN events, kills `up` with
SIGKILL at a random (seeded) moment — while the file is still being published, or after the broker
acknowledged it and before metering consumed it, or later — and starts `up` again on the same
home. The broker's memory dies with `up`; the producers' outboxes (metered acknowledgement, the
default with the embedded broker) still hold every event metering has not recorded, and publish
them again to the new broker. After each restart the rollups must equal the reference exactly
(0 lost, 0 double), and at the end `infermeter reconcile` passes.

The runs are split in two tests of half of them each, on a stack and home of their own, so that
two workers of the suite run them side by side; together they are the issue's ten runs.

INFERMETER_KILL9_RUNS sets the number of runs (default 10, the issue's count),
INFERMETER_KILL9_EVENTS the events ingested per run (default 10,000: 100k over the ten runs, plus
the gateway's), INFERMETER_KILL9_SEED the seed (each half draws its kill moments from seed + its
first run).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from infermeter.stack.ports import free_port
from infermeter.stack.postgres import to_libpq_url
from tests.cli.test_cli import CLI
from tests.cli.test_up import _left_behind, _start_up, _wait_ready
from tests.metering.conftest import request_event

RUNS = int(os.environ.get("INFERMETER_KILL9_RUNS", "10"))
SEED = int(os.environ.get("INFERMETER_KILL9_SEED", "20261102"))
EVENTS_PER_RUN = int(os.environ.get("INFERMETER_KILL9_EVENTS", "10000"))  # 10 runs x 10k = 100k ingested
HALVES = [range(0, (RUNS + 1) // 2), range((RUNS + 1) // 2, RUNS)]
CUSTOMERS = ("c0", "c1", "c2", "c3", "c4")
GATEWAY_CUSTOMER = "gw-cust"
STUB_MODEL = "stub-model"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    # a producer whose broker died gives up on it after 3 s (its events stay spooled)
    env.update(INFERMETER_HOME=str(home), INFERMETER_EMITTER_STALL_TIMEOUT_MS="3000", **extra)
    return env


def _wait_http(url: str, process: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.returncode
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not ready")


class Load:
    """Chat completions through the gateway, one after another (~40/s), counting the answers."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.body = json.dumps({"model": STUB_MODEL, "max_tokens": 16,
                                "messages": [{"role": "user", "content": "hello"}]}).encode()
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.ok = 0
        self.failed: Counter = Counter()
        self.running = threading.Event()
        self.idle = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.1)
                continue
            self.idle.clear()
            try:
                request = urllib.request.Request(self.url, data=self.body, headers=self.headers)
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
                    self.ok += 1
            except urllib.error.HTTPError as exc:
                self.failed[exc.code] += 1
            except OSError as exc:
                self.failed[type(exc).__name__] += 1
            time.sleep(0.025)

    def pause(self) -> None:
        self.running.clear()
        self.idle.wait(60)

    def stop(self) -> None:
        self.done.set()
        self.running.set()
        self.thread.join(60)


def _spooled(home: Path) -> dict[str, int]:
    counts = {}
    for path in sorted((home / "spool").glob("*.sqlite3")):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            counts[path.stem] = conn.execute("SELECT count(*) FROM spooled_events").fetchone()[0]
        finally:
            conn.close()
    return counts


def _metered(dsn: str) -> tuple[dict[str, tuple[int, int, int, int]], tuple[int, int], Counter]:
    """Rollups per customer (requests, input, cached input, output), raw events (rows, distinct keys) and
    the gateway's request events by status (`ok`, `error`, ...), from one snapshot (metering writes a
    batch's raw events and rollups in one transaction, so the three agree)."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rows = conn.execute(
            "SELECT customer_id, sum(requests), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens) "
            "FROM request_rollup_hourly GROUP BY customer_id"
        ).fetchall()
        raw = conn.execute("SELECT count(*), count(DISTINCT (source, event_id)) FROM raw_events").fetchone()
        statuses = conn.execute(
            "SELECT payload->'data'->>'status', count(*) FROM raw_events "
            "WHERE customer_id = %s AND type = 'infermeter.request.v1' GROUP BY 1",
            (GATEWAY_CUSTOMER,),
        ).fetchall()
    return (
        {r[0]: tuple(int(x) for x in r[1:]) for r in rows},
        (int(raw[0]), int(raw[1])),
        Counter({status: int(n) for status, n in statuses}),
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # five restarts of the whole stack: 2-4 min here, more beside other workers
@pytest.mark.parametrize("runs", [half for half in HALVES if half], ids=lambda runs: f"runs-{runs.start}-{runs.stop - 1}")
def test_kill_9_of_up_while_events_arrive_loses_and_doubles_nothing(tmp_path, runs):
    rng = random.Random(SEED + runs.start)
    home = Path(tempfile.mkdtemp(prefix="infermeter-kill9-")) / "home"
    started = time.monotonic()
    up = _start_up(home)
    processes: list[subprocess.Popen] = []
    load = None
    report = []
    try:
        _wait_ready(up, home)
        key = subprocess.run(CLI + ["keys", "create", "--customer", GATEWAY_CUSTOMER], env=_env(home),
                             capture_output=True, text=True, timeout=120)
        token = next(line.split()[-1] for line in key.stdout.splitlines() if line.startswith("secret:"))
        stub_port, gw_port = free_port(), free_port()
        stub = subprocess.Popen([sys.executable, "-m", "bench.gateway", "--stub", str(stub_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        processes.append(stub)
        gateway_log = open(tmp_path / "gateway.log", "w")  # noqa: SIM115 - handed to the process
        gateway = subprocess.Popen(
            CLI + ["serve", "gateway", "--port", str(gw_port), "--upstream", f"http://127.0.0.1:{stub_port}",
                   "--model", STUB_MODEL],
            env=_env(home), stdout=gateway_log, stderr=subprocess.STDOUT, text=True,
        )
        processes.append(gateway)
        _wait_http(f"http://127.0.0.1:{stub_port}/v1/models", stub)
        _wait_http(f"http://127.0.0.1:{gw_port}/health", gateway)
        load = Load(f"http://127.0.0.1:{gw_port}/v1/chat/completions", token)

        expected: Counter = Counter()  # customer -> requests (ingested)
        per_request = {}  # customer -> (input, cached, output) of each ingested request event
        gateway_start = datetime.now(UTC)
        for run in runs:
            events = tmp_path / f"run-{run}.jsonl"
            lines = []
            for i in range(EVENTS_PER_RUN):
                n = run * EVENTS_PER_RUN + i
                customer = CUSTOMERS[n % len(CUSTOMERS)]
                lines.append(request_event(n, customer=customer, input_tokens=100 + n % 7, cached=n % 5, output=n % 11))
                expected[customer, "requests"] += 1
                expected[customer, "input"] += 100 + n % 7
                expected[customer, "cached"] += n % 5
                expected[customer, "output"] += n % 11
            events.write_bytes(b"\n".join(lines) + b"\n")
            load.running.set()
            time.sleep(0.3)
            ingest = subprocess.Popen(CLI + ["events", "ingest", str(events)], env=_env(home),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            delay = rng.uniform(0.5, 2.5)
            time.sleep(delay)
            ingest_done_at_kill = ingest.poll() is not None
            os.kill(up.pid, signal.SIGKILL)
            up.wait(10)
            spooled_at_kill = _spooled(home)
            out, _ = ingest.communicate(timeout=120)
            up = _start_up(home)
            _wait_ready(up, home)
            # the load goes on during the restart; then it pauses so the reference stands still
            time.sleep(rng.uniform(0.2, 1.0))
            load.pause()
            dsn = to_libpq_url(json.loads((home / "stack.json").read_text())["database_url"])
            want = {c: (expected[c, "requests"], expected[c, "input"], expected[c, "cached"], expected[c, "output"])
                    for c in CUSTOMERS}
            deadline = time.monotonic() + 120
            while True:
                got, raw, statuses = _metered(dsn)
                gw = got.get(GATEWAY_CUSTOMER, (0, 0, 0, 0))
                settled = all(n == 0 for n in _spooled(home).values())
                if settled and {c: got.get(c) for c in CUSTOMERS} == want and statuses["ok"] == load.ok:
                    break
                assert time.monotonic() < deadline, (
                    f"run {run}: after {delay:.2f} s kill and restart, metering has {got} (raw {raw}), "
                    f"expected {want} and {load.ok} ok gateway requests (events by status {dict(statuses)}, "
                    f"client failures {dict(load.failed)}); spooled {_spooled(home)}; ingest said {out}; "
                    f"gateway said {(tmp_path / 'gateway.log').read_text()[-3000:]}"
                )
                time.sleep(0.2)
            per_request[GATEWAY_CUSTOMER] = gw
            # A request the gateway failed after admitting it (its database can be briefly down around a
            # restart: residency or admission) is one `error` event of 0 tokens; one at most per failure.
            assert statuses.total() - statuses["ok"] <= sum(load.failed.values()), (statuses, load.failed)
            assert gw[0] == statuses.total()
            assert raw == (sum(want[c][0] for c in CUSTOMERS) + gw[0],) * 2  # 0 lost, 0 double
            report.append(f"run {run}: kill after {delay:.2f} s (ingest {'done' if ingest_done_at_kill else 'running'}, "
                          f"spooled at kill {spooled_at_kill}); metered {raw[0]} events, gateway {load.ok} requests")
        # Requests the gateway failed (its database can be briefly down around a restart) were not
        # served: at most an `error` event of 0 tokens each; every request it answered 200 is an `ok`
        # event, exactly once.
        assert set(load.failed) <= {500, 502, 503}, load.failed
        _, gw_input, _, gw_output = per_request[GATEWAY_CUSTOMER]
        assert statuses["ok"] == load.ok > 0
        assert gw_input % load.ok == 0 and gw_output % load.ok == 0  # every served request counted whole
        # the user's view: usage and reconcile through the CLI
        usage = subprocess.run(CLI + ["usage", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-05T00:00:00Z", "--json"],
                               env=_env(home), capture_output=True, text=True, timeout=120)
        rows = {r["customer_id"]: r["requests"] for r in json.loads(usage.stdout)["rows"]}
        assert rows == {c: expected[c, "requests"] for c in CUSTOMERS}
        hour = gateway_start.replace(minute=0, second=0, microsecond=0)
        for start, end in (("2026-11-02T00:00:00Z", "2026-11-05T00:00:00Z"),
                           (hour.isoformat(), (datetime.now(UTC) + timedelta(hours=1)).replace(
                               minute=0, second=0, microsecond=0).isoformat())):
            reconcile = subprocess.run(CLI + ["reconcile", "--from", start, "--to", end], env=_env(home),
                                       capture_output=True, text=True, timeout=120)
            assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr
    finally:
        if load is not None:
            load.stop()
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
        print("\n".join(report))
        log_path = tmp_path / "gateway.log"
        if log_path.exists():  # what the gateway complained about, once each
            complaints = Counter(line.strip()[:200] for line in log_path.read_text().splitlines()
                                 if "rror" in line or "WARNING" in line.upper())
            print("gateway log:", *[f"  {n} x {line}" for line, n in complaints.most_common(12)], sep="\n")
        print(f"{len(runs)} runs of {EVENTS_PER_RUN} ingested events in {time.monotonic() - started:.0f} s; "
              f"gateway: {load.ok if load else 0} requests answered, failed {dict(load.failed) if load else {}}")
    assert _left_behind(home) == {}
