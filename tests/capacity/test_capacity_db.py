"""The capacity signal on real PostgreSQL: synthetic replays (tests/capacity/sim.py) written through
metering's real write path (processor + BatchWriter: raw events, rollups, GPU ledger), read back
through metering.ops_reads by serving.capacity_service, minute by minute as a live gateway would
(each evaluation sees only the events whose event time is before it). Then the endpoint, the CLI
and the gauges on the same data."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from metering.contract import encode_event
from metering.kafka_types import Message
from metering.writer import BatchWriter
from serving import metrics
from serving.capacity import Policy
from serving.capacity_service import SETTLE_S, CapacityRefresher, capacity_reports
from tests.capacity import sim
from tests.conftest import new_database

BASE = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
WARM_MIN = 15  # minutes of light load before the ramp
RAMP = "dep-ramp"
FLAT = "dep-flat"
FLAT_RATE = 2.9  # requests/s: ~0.95 of one replica at 0.7 utilisation, so minute noise crosses the boundary


def _ramp_events() -> tuple[list[dict], list[sim.Request]]:
    """0.3 requests/s for 15 minutes, then the arrival rate doubles every minute for 7 minutes."""
    warm, lam0 = WARM_MIN * 60, 0.3
    rate = lambda t: lam0 if t < warm else lam0 * 2 ** ((t - warm) / 60)  # noqa: E731
    until = warm + 7 * 60
    rng = random.Random(7)
    requests, steps = sim.serve(sim.arrivals(rate, rate(until), until, rng), rng)
    intervals = sim.intervals(steps, max(r.finish for r in requests) + 10)
    return sim.events(requests, intervals, BASE, deployment=RAMP, replica=f"{RAMP}-0"), requests


def _flat_events() -> list[dict]:
    rng = random.Random(11)
    requests, steps = sim.serve(sim.arrivals(lambda t: FLAT_RATE, FLAT_RATE, 40 * 60, rng), rng)
    intervals = sim.intervals(steps, max(r.finish for r in requests) + 10)
    return sim.events(requests, intervals, BASE, deployment=FLAT, replica=f"{FLAT}-0")


@pytest.fixture(scope="module")
def replay(pg_server_url):
    """One database holding both replays, written through metering's BatchWriter."""
    db_url = new_database(pg_server_url)
    ramp, requests = _ramp_events()
    everything = ramp + _flat_events()
    writer = BatchWriter(to_libpq_url(db_url), group_id="capacity-tests", max_bytes=65536, future_tolerance_s=300)
    try:
        for i in range(0, len(everything), 2000):
            batch = [Message("events", 0, i + j, None, encode_event(e), {}, None)
                     for j, e in enumerate(everything[i:i + 2000])]
            assert writer.write(batch).accepted == len(batch)
    finally:
        writer.close()
    return db_url, requests


def _report(conn, deployment: str, minute_end: int, policy: Policy = Policy(), **kw) -> dict:
    """The report a live reader would have computed SETTLE_S after minute `minute_end` of the replay."""
    now = BASE + timedelta(minutes=minute_end, seconds=SETTLE_S)
    [found] = capacity_reports(conn, now=now, policy=policy, deployment_id=deployment, **kw)
    return found


def test_the_reads_match_what_was_sent(replay):
    db_url, requests = replay
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        r = _report(conn, RAMP, 18)
        rollup = conn.execute("SELECT sum(requests), sum(input_tokens), sum(output_tokens) FROM request_rollup_hourly "
                              "WHERE deployment_id = %s", (RAMP,)).fetchone()
    assert rollup == (len(requests), sum(q.prompt for q in requests), sum(q.output for q in requests))
    in_minute = [q for q in requests if 17 * 60 <= q.finish < 18 * 60]  # the last complete minute at 18:10
    assert r["as_of"] == "2026-11-02T08:18:00Z" and r["demand"]["minute"] == "2026-11-02T08:17:00Z"
    assert r["demand"]["arrivals_per_s"] == round(len(in_minute) / 60, 3)
    assert r["demand"]["tokens_per_s"] == round(sum(q.prompt + q.output for q in in_minute) / 60, 3)
    assert r["demand"]["ttft_p90_s"] == pytest.approx(sim.p90([q.first_token - q.arrival for q in in_minute]), abs=1e-3)
    assert r["replicas"] == 1 and [x["replica_id"] for x in r["capacity"]["replicas"]] == [f"{RAMP}-0"]


def test_doubling_arrivals_raise_the_recommendation_before_p90_ttft_doubles(replay, capsys):
    db_url, _ = replay
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        warm = _report(conn, RAMP, WARM_MIN, history=True)
        warm_ttft = sorted(m["ttft_p90_s"] for m in warm["history"][-10:])  # the warm-up's last 10 minutes
        baseline = warm_ttft[len(warm_ttft) // 2]  # the median minute's p90
        assert warm["recommended_replicas"] == 1
        rise = doubled = None
        trace = []
        for k in range(WARM_MIN + 1, WARM_MIN + 9):
            r = _report(conn, RAMP, k)
            trace.append((k, r["demand"]["arrivals_per_s"], r["forecast"]["tokens_per_s"],
                          r["capacity"]["tokens_per_busy_s"], r["recommended_replicas"], r["demand"]["ttft_p90_s"]))
            if rise is None and r["recommended_replicas"] > 1:
                rise = k
            if doubled is None and r["demand"]["ttft_p90_s"] is not None and r["demand"]["ttft_p90_s"] >= 2 * baseline:
                doubled = k
    with capsys.disabled():
        print(f"\nramp (doubling every minute from 08:{WARM_MIN}): baseline p90 TTFT {baseline:.3f} s")
        for k, arrivals, forecast, cap, rec, ttft in trace:
            print(f"  as of 08:{k:02d}: {arrivals:6.2f} req/s, forecast {forecast:7.0f} tok/s, "
                  f"capacity {cap:6.0f} tok/s, recommended {rec}, p90 TTFT {ttft} s")
        print(f"  recommendation > 1 as of 08:{rise}, p90 TTFT doubled as of 08:{doubled}: "
              f"lead {(doubled - rise) * 60} s")
    assert rise is not None and doubled is not None and rise < doubled


def test_a_flat_load_holds_the_recommendation_still(replay):
    db_url, _ = replay
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        reports = [_report(conn, FLAT, k) for k in range(10, 40)]
        last = _report(conn, FLAT, 40, history=True)
    held = {r["recommended_replicas"] for r in reports}
    assert len(held) == 1, [r["recommended_replicas"] for r in reports]
    needed = [m["needed_replicas"] for m in last["history"] if m["needed_replicas"] is not None][-30:]
    assert len(set(needed)) > 1  # the minute-by-minute need does cross the boundary: the hysteresis holds it


@pytest.fixture
def api(replay, pg_server_url):
    from app.api import create_app
    from serving.keys import KeyStore

    db_url, _ = replay
    settings = Settings(DATABASE_URL=db_url, INFERMETER_ADMIN_TOKEN="adm", INFERMETER_PRODUCER_TOKEN="prod")
    engine = create_engine(db_url)
    _, customer_key = KeyStore(engine, settings=settings).create("cust-sim")
    engine.dispose()
    with TestClient(create_app(settings, db_url, None)) as client:
        yield client, customer_key


def test_the_endpoint_is_admin_only(api):
    client, customer_key = api
    path, at = f"/v1/deployments/{RAMP}/capacity", {"at": "2026-11-02T08:20:10Z"}
    assert client.get(path, params=at).status_code == 401
    assert client.get(path, params=at, headers={"Authorization": "Bearer wrong"}).status_code == 401
    for token in ("prod", customer_key):
        denied = client.get(path, params=at, headers={"Authorization": f"Bearer {token}"})
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
    ok = client.get(path, params={**at, "history": "true"}, headers={"Authorization": "Bearer adm"})
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["deployment_id"] == RAMP and body["as_of"] == "2026-11-02T08:20:00Z"
    assert body["recommended_replicas"] >= 2 and len(body["history"]) == 60
    missing = client.get("/v1/deployments/nope/capacity", params=at, headers={"Authorization": "Bearer adm"})
    assert missing.status_code == 404
    bad = client.get(path, params={"at": "yesterday"}, headers={"Authorization": "Bearer adm"})
    assert bad.status_code == 400


def test_the_cli_json(replay, tmp_path):
    db_url, _ = replay
    env = {**os.environ, "DATABASE_URL": db_url, "INFERMETER_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "app.cli", "capacity", "--at", "2026-11-02T08:20:10Z", "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    reports = json.loads(out.stdout)["deployments"]
    assert [r["deployment_id"] for r in reports] == [FLAT, RAMP]
    one = subprocess.run([sys.executable, "-m", "app.cli", "capacity", "--deployment", RAMP, "--at",
                          "2026-11-02T08:20:10Z", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(one.stdout)["deployments"] == [reports[1]]
    assert {"demand", "forecast", "capacity", "utilisation", "recommended_replicas"} <= set(reports[1])
    table = subprocess.run([sys.executable, "-m", "app.cli", "capacity", "--at", "2026-11-02T08:20:10Z"],
                           env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and RAMP in table.stdout and "recommended" in table.stdout, table.stderr


def test_the_refresher_publishes_the_gauges(replay):
    db_url, _ = replay
    engine = create_engine(db_url)
    settings = Settings(DATABASE_URL=db_url)
    try:
        refresher = CapacityRefresher(engine, settings, clock=lambda: BASE + timedelta(minutes=20, seconds=SETTLE_S))
        reports = {r["deployment_id"]: r for r in refresher.refresh_once()}
    finally:
        engine.dispose()
    samples = {(s.name, s.labels.get("deployment")): s.value
               for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    for dep in (RAMP, FLAT):
        assert samples[("infermeter_deployment_recommended_replicas", dep)] == reports[dep]["recommended_replicas"]
        assert samples[("infermeter_deployment_demand_tokens_per_second", dep)] == reports[dep]["demand"]["tokens_per_s"]
        assert samples[("infermeter_deployment_capacity_tokens_per_second", dep)] > 0
        assert ("infermeter_deployment_demand_forecast_tokens_per_second", dep) in samples


def test_the_refresher_runs_every_period_and_stops(replay):
    import asyncio

    db_url, _ = replay
    engine = create_engine(db_url)
    clock = lambda: BASE + timedelta(minutes=20, seconds=SETTLE_S)  # noqa: E731

    async def run(period: str, rounds: int) -> int:
        """Runs the refresher until it has done `rounds` rounds (60 s at most: a loaded machine runs
        them late, never not at all), or for 0.5 s when `rounds` is 0; then stops it."""
        refresher = CapacityRefresher(engine, Settings(DATABASE_URL=db_url, INFERMETER_CAPACITY_REFRESH_S=period),
                                      clock=clock)
        refresher.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (60.0 if rounds else 0.5)
        while loop.time() < deadline and (rounds == 0 or refresher.rounds < rounds):
            await asyncio.sleep(0.05)
        await refresher.aclose()
        assert refresher.task is None
        return refresher.rounds

    try:
        assert asyncio.run(run("0.1", 3)) >= 3
        assert asyncio.run(run("0", 0)) == 0  # 0 turns it off
    finally:
        engine.dispose()
