"""Demand at arrival (serving/capacity_arrivals.py): under an overload the capacity signal sees the
requests that came, not only those served. A synthetic replica (tests/capacity/sim.py) is offered
about twice what it can serve; its events go through metering's real write path into PostgreSQL,
and the gateway's tally counts each request at its arrival with the p50 output a fitted
prediction.RequestModel predicts for it, then flushes it to the database, where every reader sees it."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import create_engine

from bench.prediction import write_events
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from metering.contract import encode_event
from prediction.request import RequestFeatures, RequestObservation, fit_requests
from serving.capacity import Minute, Policy
from serving.capacity_arrivals import ArrivalDemand, merge
from serving.capacity_arrivals_store import ArrivalFlusher
from serving.capacity_service import SETTLE_S, CapacityRefresher, capacity_reports
from tests.capacity import sim
from tests.conftest import new_database

BASE = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
DEP = "dep-overload"
RATE = 30.0  # requests/s offered; the simulated replica serves about half of it
MINUTES = 4


@pytest.fixture(scope="module")
def overload(pg_server_url):
    rng = random.Random(5)
    requests, steps = sim.serve(sim.arrivals(lambda t: RATE, RATE, MINUTES * 60, rng), rng)
    intervals = sim.intervals(steps, max(r.finish for r in requests) + 10)
    events = sim.events(requests, intervals, BASE, deployment=DEP, replica=f"{DEP}-0")
    db_url = new_database(pg_server_url)
    write_events(db_url, [encode_event(e) for e in events])  # metering's write path
    # the p50 the gateway would predict: a fit on earlier requests of the same traffic
    history = [RequestObservation("//test/gw", f"h{i}", sim.CUSTOMER, "sim-model", "ok", r.prompt, 0, r.output,
                                  BASE - timedelta(hours=1), BASE - timedelta(hours=1)) for i, r in enumerate(requests[:500])]
    p50 = fit_requests(history).predict_request(RequestFeatures(sim.CUSTOMER, "sim-model", 200)).output_tokens_p50
    now = [0.0]
    demand = ArrivalDemand(clock=lambda: now[0])
    for r in requests:  # what the gateway admitted, when it admitted it
        now[0] = BASE.timestamp() + r.arrival
        demand.arrive(DEP, p50)
    at = BASE + timedelta(minutes=MINUTES - 1, seconds=SETTLE_S)  # the report after minute 3
    engine = create_engine(db_url)
    try:  # metering alone, before the gateway's tally reaches the database
        with psycopg.connect(to_libpq_url(db_url)) as conn:
            [metered] = capacity_reports(conn, now=at, policy=Policy(), deployment_id=DEP)
        [metered_gauges] = CapacityRefresher(engine, Settings(DATABASE_URL=db_url), clock=lambda: at).refresh_once()
    finally:
        engine.dispose()
    flusher = ArrivalFlusher(demand, lambda: psycopg.connect(to_libpq_url(db_url)), instance="gw-overload")
    return db_url, requests, flusher, p50, at, metered, metered_gauges


def test_under_overload_the_signal_sees_arrivals_not_finishes(overload):
    db_url, requests, flusher, p50, now, metered, _ = overload
    as_of_minute = MINUTES - 1  # its last complete minute is minute 2, mid-overload
    arrived = [r for r in requests if (as_of_minute - 1) * 60 <= r.arrival < as_of_minute * 60]
    finished = [r for r in requests if (as_of_minute - 1) * 60 <= r.finish < as_of_minute * 60]
    assert len(finished) < 0.7 * len(arrived)  # it is an overload: the replica serves far less than comes
    flusher.flush_once()
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        [seen] = capacity_reports(conn, now=now, policy=Policy(), deployment_id=DEP)
    # metering alone: what was served in that minute; with arrivals: what came
    assert metered["demand"]["arrivals_per_s"] == round(len(finished) / 60, 3)
    assert seen["demand"]["arrivals_per_s"] == round(len(arrived) / 60, 3)
    assert seen["demand"]["output_tokens_per_s"] == round(max(len(arrived) * p50, sum(r.output for r in finished)) / 60, 3)
    assert seen["demand"]["output_tokens_per_s"] > metered["demand"]["output_tokens_per_s"]
    per_request = seen["demand"]["prompt_tokens_per_s"] * 60 / len(arrived)  # estimated from what was metered
    assert 100 <= per_request <= 300 and seen["demand"]["prompt_tokens_per_s"] > metered["demand"]["prompt_tokens_per_s"]
    assert seen["recommended_replicas"] > metered["recommended_replicas"]


def test_the_gateways_gauges_count_arrivals(overload):
    db_url, _, flusher, _, now, _, metered = overload
    engine = create_engine(db_url)
    try:  # the gateway's refresher flushes its tally first (a no-op if the test above flushed it)
        gateway = CapacityRefresher(engine, Settings(DATABASE_URL=db_url), clock=lambda: now, flusher=flusher)
        [seen] = gateway.refresh_once()
    finally:
        engine.dispose()
    assert seen["demand"]["tokens_per_s"] > metered["demand"]["tokens_per_s"]


def test_merge_keeps_the_larger_figures_per_minute():
    t = BASE
    metered = [Minute(t, 10, 2000, 300, 0.5), Minute(t + timedelta(minutes=1), 12, 2400, 500, 0.4)]  # 200 per request
    arrived = [Minute(t, requests=25, output_tokens=400), Minute(t + timedelta(minutes=1), requests=11, output_tokens=200),
               Minute(t + timedelta(minutes=2), requests=30, output_tokens=600)]
    assert merge(metered, arrived) == [
        Minute(t, 25, 5000, 400, 0.5),  # overload: arrivals win (prompts 25 x 200), TTFT stays metering's
        Minute(t + timedelta(minutes=1), 12, 2400, 500, 0.4),  # steady: metering's actual figures win
        Minute(t + timedelta(minutes=2), 30, 6000, 600, None),  # arrived, nothing metered yet in that minute
    ]
    assert merge([], arrived[:1]) == [Minute(t, 25, 0, 400)]  # nothing metered at all: prompts unknown


def test_the_tally_forgets_minutes_older_than_it_keeps():
    now = [BASE.timestamp()]
    demand = ArrivalDemand(keep_min=5, clock=lambda: now[0])
    demand.arrive("d", 10)
    now[0] += 6 * 60
    demand.arrive("d", 20)
    window = demand.minutes(BASE - timedelta(hours=1), BASE + timedelta(hours=1))
    assert window == {"d": [Minute(BASE + timedelta(minutes=6), requests=1, output_tokens=20)]}
