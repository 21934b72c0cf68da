"""Demand at arrival shared through PostgreSQL (serving/capacity_arrivals_store.py): two gateways'
tallies flushed to `capacity_arrivals_minutely`, and every reader (the API, the CLI, each gateway's
gauges) computing the same report from their sum. Clocks are injected: nothing sleeps."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from serving import metrics
from serving.capacity import Minute, Policy
from serving.capacity_arrivals import ArrivalDemand
from serving.capacity_arrivals_store import ArrivalFlusher, arrival_minutes, new_gateway_instance
from serving.capacity_service import SETTLE_S, CapacityRefresher, capacity_reports
from tests.cli_in_process import run_cli

BASE = datetime(2026, 11, 4, 10, 0, tzinfo=UTC)
DEP = "dep-shared"


class Gateway:
    """One gateway process's tally and flusher, on its own clock (seconds since BASE)."""

    def __init__(self, connect, instance: str, keep_min: int = 90) -> None:
        self.t = 0.0
        self.tally = ArrivalDemand(keep_min=keep_min, clock=lambda: BASE.timestamp() + self.t)
        self.flusher = ArrivalFlusher(self.tally, connect, instance=instance)

    def admit(self, n: int, predicted_output_tokens: int, at_s: float) -> None:
        self.t = at_s
        for _ in range(n):
            self.tally.arrive(DEP, predicted_output_tokens)


def _rows(db_url: str) -> list[tuple]:
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        rows = conn.execute("SELECT deployment_id, minute, gateway_instance, requests, predicted_output_tokens "
                            "FROM capacity_arrivals_minutely ORDER BY 1, 2, 3").fetchall()
    return [(dep, minute.astimezone(UTC), instance, requests, output) for dep, minute, instance, requests, output in rows]


@pytest.fixture
def connect(db_url):
    """Connections to the test's database, counted."""
    opened = []

    def connect():
        opened.append(1)
        return psycopg.connect(to_libpq_url(db_url))

    connect.opened = opened
    return connect


def test_every_reader_reports_the_sum_over_the_gateways(db_url, connect, monkeypatch, capsys, tmp_path):
    a, b = Gateway(connect, "gw-a-1"), Gateway(connect, "gw-b-1")
    a.admit(30, 12, at_s=5)
    b.admit(45, 20, at_s=30)
    assert a.flusher.flush_once() == 1 and b.flusher.flush_once() == 1
    at = BASE + timedelta(minutes=1, seconds=SETTLE_S)  # the report whose last complete minute is 10:00

    def api_report() -> dict:
        from app.api import create_app

        settings = Settings(DATABASE_URL=db_url, INFERMETER_ADMIN_TOKEN="adm")
        with TestClient(create_app(settings, db_url, None)) as client:
            got = client.get(f"/v1/deployments/{DEP}/capacity", params={"at": at.isoformat()},
                             headers={"Authorization": "Bearer adm"})
        assert got.status_code == 200, got.text
        return got.json()

    def cli_report() -> dict:
        from infermeter.settings import get_settings

        monkeypatch.setenv("DATABASE_URL", db_url)
        monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
        get_settings.cache_clear()
        try:
            out = run_cli(monkeypatch, capsys, "capacity", "--deployment", DEP, "--at", at.isoformat(), "--json")
        finally:
            get_settings.cache_clear()
        assert out.code == 0, out.err
        [report] = out.json()["deployments"]
        return report

    def gateway_report(gateway: Gateway) -> dict:
        engine = create_engine(db_url)
        try:
            refresher = CapacityRefresher(engine, Settings(DATABASE_URL=db_url), clock=lambda: at,
                                          flusher=gateway.flusher)
            [report] = refresher.refresh_once()
        finally:
            engine.dispose()
        gauges = {(s.name, s.labels.get("deployment")): s.value
                  for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
        assert gauges[("infermeter_deployment_demand_tokens_per_second", DEP)] == report["demand"]["tokens_per_s"]
        return report

    with psycopg.connect(to_libpq_url(db_url)) as conn:
        [report] = capacity_reports(conn, now=at, policy=Policy(), deployment_id=DEP)
    assert report["demand"]["minute"] == "2026-11-04T10:00:00Z"
    assert report["demand"]["arrivals_per_s"] == round(75 / 60, 3)  # 30 + 45: both gateways
    assert report["demand"]["output_tokens_per_s"] == round((30 * 12 + 45 * 20) / 60, 3)
    assert api_report() == report and cli_report() == report
    assert gateway_report(a) == report and gateway_report(b) == report  # the gauges aggregated with max: the sum

    # Gateway a admits 15 more in the same minute and has not flushed them: its own report counts them
    # (it flushes before computing), and from then on every reader does.
    a.admit(15, 12, at_s=59)
    mine = gateway_report(a)
    assert mine["demand"]["arrivals_per_s"] == round(90 / 60, 3)
    assert mine["demand"]["output_tokens_per_s"] == round((45 * 12 + 45 * 20) / 60, 3)
    assert api_report() == mine and cli_report() == mine and gateway_report(b) == mine
    assert _rows(db_url) == [(DEP, BASE, "gw-a-1", 45, 45 * 12), (DEP, BASE, "gw-b-1", 45, 45 * 20)]


class LostAcknowledgement:
    """A connection whose first commit reaches the database but whose answer is lost."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.lost = False

    def execute(self, *args, **kwargs):
        return self.conn.execute(*args, **kwargs)

    def commit(self) -> None:
        self.conn.commit()
        if not self.lost:
            self.lost = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")


def test_a_minute_flushed_twice_counts_once(db_url, connect):
    gw = Gateway(connect, "gw-1")
    gw.admit(3, 7, at_s=10)
    assert gw.flusher.flush_once() == 1
    opened = len(connect.opened)
    assert gw.flusher.flush_once() == 0  # nothing new: nothing written, no connection
    assert len(connect.opened) == opened
    assert _rows(db_url) == [(DEP, BASE, "gw-1", 3, 21)]

    # the minute goes on (written partial before, now in full); the commit succeeds but the gateway
    # never hears of it, so it writes the same minute again at the next tick
    gw.admit(2, 7, at_s=40)
    lossy = LostAcknowledgement(psycopg.connect(to_libpq_url(db_url)))

    @contextlib.contextmanager
    def lost_once():
        with lossy.conn:
            yield lossy

    gw.flusher.connect = lost_once
    with pytest.raises(psycopg.OperationalError):
        gw.flusher.flush_once()
    assert _rows(db_url) == [(DEP, BASE, "gw-1", 5, 35)]  # it did reach the database
    gw.flusher.connect = connect
    assert gw.flusher.flush_once() == 1  # written again, full counts: not added
    assert _rows(db_url) == [(DEP, BASE, "gw-1", 5, 35)]

    # a restarted gateway process is another instance: its rows sit beside, they overwrite nothing
    again = Gateway(connect, new_gateway_instance("gw"))
    again.admit(1, 7, at_s=50)
    again.flusher.flush_once()
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        assert arrival_minutes(conn, BASE, BASE + timedelta(minutes=1)) == {
            DEP: [Minute(BASE, requests=6, output_tokens=42)]}


def test_minutes_older_than_kept_are_deleted(db_url, connect):
    gw = Gateway(connect, "gw-live", keep_min=5)
    gone = Gateway(connect, "gw-gone", keep_min=5)  # a gateway that stopped: its rows are deleted too
    gw.admit(1, 1, at_s=0)
    gone.admit(2, 1, at_s=30)
    gone.admit(3, 1, at_s=60)
    gw.flusher.flush_once()
    gone.flusher.flush_once()
    minute = lambda k: BASE + timedelta(minutes=k)  # noqa: E731
    assert [r[1:3] for r in _rows(db_url)] == [(minute(0), "gw-gone"), (minute(0), "gw-live"), (minute(1), "gw-gone")]
    gw.admit(4, 1, at_s=6 * 60)  # minute 6: the tally keeps minutes 1 to 6
    assert gw.flusher.flush_once() == 1
    assert _rows(db_url) == [(DEP, minute(1), "gw-gone", 3, 3), (DEP, minute(6), "gw-live", 4, 4)]
    assert gw.tally.unflushed() == []


def test_a_failed_flush_is_retried_and_counts_once(db_url, connect, caplog):
    down = [True]

    def flaky():
        if down[0]:
            raise psycopg.OperationalError("connection refused")
        return connect()

    gw = Gateway(flaky, "gw-1")
    caplog.set_level(logging.INFO, logger="serving.capacity")
    gw.admit(4, 10, at_s=5)
    gw.flusher.tick()
    gw.admit(2, 10, at_s=15)  # counting goes on while the database is away
    gw.flusher.tick()
    assert gw.flusher.failing and _rows(db_url) == []
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 1 and "flush" in failures[0].getMessage()  # logged once, not at every tick
    down[0] = False
    gw.flusher.tick()
    gw.flusher.tick()
    assert not gw.flusher.failing
    assert _rows(db_url) == [(DEP, BASE, "gw-1", 6, 60)]
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    assert any("succeeded again" in r.getMessage() for r in caplog.records)


def test_stop_flushes_what_is_left(db_url, connect):
    gw = Gateway(connect, "gw-1")
    gw.flusher.period_s = 3600.0  # the worker thread would not tick before the stop
    gw.flusher.start()
    gw.admit(2, 5, at_s=1)
    gw.flusher.stop()
    assert gw.flusher._thread is None
    assert _rows(db_url) == [(DEP, BASE, "gw-1", 2, 10)]


def test_the_tally_hands_over_changed_minutes_with_full_counts():
    now = [BASE.timestamp()]
    tally = ArrivalDemand(keep_min=5, clock=lambda: now[0])
    tally.arrive("d", 10)
    tally.arrive("d", 10)
    first = tally.unflushed()
    assert first == [("d", int(BASE.timestamp() // 60), 2, 20)]
    assert tally.unflushed() == first  # not yet written: handed over again
    tally.flushed(first)
    assert tally.unflushed() == []
    tally.arrive("d", 5)
    assert tally.unflushed() == [("d", int(BASE.timestamp() // 60), 3, 25)]  # the minute's full count
    now[0] += 6 * 60  # the minute is no longer kept: not handed over, even if never written
    assert tally.unflushed() == []


def test_the_gateway_flushes_what_it_admits(settings, db_url):
    """build_gateway's wiring, against a stub replica: requests through the gateway reach the table
    under this process's own name, by the flush before a /metrics round and by the last flush at stop."""
    import httpx

    from serving.gateway import build_gateway, serve_in_thread
    from serving.upstreams import single_upstream
    from tests.serving_control.stub_vllm import StubLoop

    settings = settings.model_copy(update={"admin_token_configured": "adm", "gateway_id": "gw-wired"})
    with StubLoop() as loop:
        replica = loop.replica("r0")
        served = serve_in_thread(build_gateway(settings, upstreams=single_upstream("m", replica.url)))
        try:
            deployment = served.state.upstreams.route("m").deployment_id
            with httpx.Client(base_url=served.url, timeout=30,
                              headers={"Authorization": "Bearer adm", "X-Infermeter-Customer-Id": "cust-1"}) as http:
                for _ in range(2):
                    ok = http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3})
                    assert ok.status_code == 200, ok.text
                assert http.get("/metrics").status_code == 200  # its round flushes first
                with psycopg.connect(to_libpq_url(db_url)) as conn:
                    first = conn.execute("SELECT gateway_instance, sum(requests) FROM capacity_arrivals_minutely "
                                         "WHERE deployment_id = %s GROUP BY 1", (deployment,)).fetchall()
                assert len(first) == 1 and first[0][0].startswith("gw-wired-") and first[0][1] == 2
                assert http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}).status_code == 200
        finally:
            served.stop()
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        after = conn.execute("SELECT gateway_instance, sum(requests) FROM capacity_arrivals_minutely "
                             "WHERE deployment_id = %s GROUP BY 1", (deployment,)).fetchall()
    assert after == [(first[0][0], 3)]  # the last flush at stop
