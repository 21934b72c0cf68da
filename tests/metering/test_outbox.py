"""The producers' outbox: rows stay spooled until metering confirms them (metered ack), claims are
atomic, timed-out rows go again, and a lost broker costs nothing."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import psycopg
import pytest

from infermeter.stack.broker import start_tansu
from infermeter.stack.ports import free_port
from infermeter.stack.postgres import to_libpq_url
from metering.confirmer import MeteringConfirmer
from metering.consumer import MeteringConsumer, run_in_thread
from metering.event_identity import NO_IDENTITY, event_identity
from metering.event_lookups import handled_event_keys
from metering.intake import Intake, intake_depth
from metering.kafka import ensure_topics, make_producer
from metering.kafka_types import DeliveryFailed
from metering.processor import INGEST_ID_HEADER as PROCESSOR_INGEST_ID_HEADER
from metering.publisher import INGEST_ID_HEADER, Outbox
from metering.spool import Spool
from tests.metering.conftest import request_event, retention_clock


def test_the_ingest_header_is_metering_s():
    assert INGEST_ID_HEADER == PROCESSOR_INGEST_ID_HEADER


def test_claims_are_atomic_across_connections_and_release_puts_rows_back(tmp_path):
    path = tmp_path / "s.sqlite3"
    first, last = Spool(path).append_many([(b"k", f"v{i}".encode()) for i in range(3000)], ingest_id="run-1")
    assert (first, last) == (1, 3000)
    spools = [Spool(path) for _ in range(3)]
    taken: list[list[int]] = [[] for _ in spools]

    def publisher(n: int) -> None:
        while batch := spools[n].claim(97):
            taken[n] += [e.seq for e in batch]
            assert all(e.published_at is not None and e.attempts == 1 and e.ingest_id == "run-1" for e in batch)

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = sorted(s for part in taken for s in part)
    assert every == list(range(1, 3001))  # each row taken exactly once
    spool = spools[0]
    assert spool.counts() == (0, 3000)
    assert spool.release(range(10, 20)) == 10 and spool.counts() == (10, 2990)
    again = spool.claim(100)
    assert [e.seq for e in again] == list(range(10, 20)) and {e.attempts for e in again} == {2}
    assert spool.claim(10, up_to_seq=5) == []
    assert spool.ack(range(1, 1001)) == 1000 and spool.depth() == 2000
    assert spool.release_all() == 2000 and spool.counts() == (2000, 0)


def test_a_spool_written_before_row_states_opens_with_every_row_pending(tmp_path):
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE spooled_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB, "
                 "value BLOB NOT NULL, enqueued_at REAL NOT NULL)")
    conn.execute("INSERT INTO spooled_events (key, value, enqueued_at) VALUES (x'6b', x'7b7d', 1.0)")
    conn.commit()
    conn.close()
    spool = Spool(path)
    assert spool.counts() == (1, 0)
    [row] = spool.claim(10)
    assert (row.key, row.value, row.attempts) == (b"k", b"{}", 1)


def test_a_spool_that_leaves_checkpoints_to_its_publisher_never_checkpoints_on_append(tmp_path):
    """checkpoints="publisher" (the gateway's spool, appended on its event loop): past SQLite's
    1,000-page automatic checkpoint the database file has still not grown; `checkpoint` (the
    publisher thread's) copies the WAL in, at most once per interval; nothing is lost either way."""
    sizes = {}
    for mode in ("auto", "publisher"):
        spool = Spool(tmp_path / f"{mode}.sqlite3", checkpoints=mode)
        for i in range(1500):  # ~1 page each
            spool.append(b"k", b"v" * 3000 + str(i).encode())
        sizes[mode] = spool.path.stat().st_size
        if mode == "publisher":
            assert spool.checkpoint(every_s=0) is True
            assert spool.path.stat().st_size > 4_000_000
            assert spool.checkpoint() is False  # not due yet
        else:
            assert spool.checkpoint(every_s=0) is False  # SQLite's own
        spool.close()
        assert Spool(spool.path).depth() == 1500
    assert sizes["auto"] > 1_000_000 and sizes["publisher"] < 100_000


def _abandon(intake: Intake) -> None:
    """What `kill -9` leaves of an intake: its files as they are, its lock released by the kernel."""
    for descriptor in (intake._fd, intake._reader, intake._lock_file):
        os.close(descriptor)


def test_an_intake_left_by_a_killed_process_is_moved_once_and_a_torn_last_frame_dropped(tmp_path):
    spool = Spool(tmp_path / "g.sqlite3")
    intake = Intake(spool, rotate_bytes=2048)
    events = [(b"cust", b'{"n": %d}' % i, ("//s", f"e{i}")) for i in range(100)]
    for event in events[:60]:
        intake.append([event])
    assert (intake.pending(), spool.depth(), intake_depth(spool.path)) == (60, 0, 60)
    assert intake.move() == 60 and intake.pending() == 0  # past 2,048 bytes: a new file from here on
    assert [p.name for p in tmp_path.glob("g.sqlite3.intake-*")] == ["g.sqlite3.intake-2"]
    intake.append(events[60:80])
    intake.append([(None, b"no key, no identity", None), (b"", b"empty key, none to name", NO_IDENTITY)])
    _abandon(intake)
    [left] = tmp_path.glob("g.sqlite3.intake-*")
    left.write_bytes(left.read_bytes() + b"\x30\x00\x00\x00 a write cut short")
    assert intake_depth(spool.path) == 22

    again = Intake(spool)  # the next start: moves the 22 whole events, drops the torn one, new file
    assert again.pending() == 0 and spool.depth() == 82
    assert [p.name for p in tmp_path.glob("g.sqlite3.intake-*")] == ["g.sqlite3.intake-3"]
    rows = spool.peek(200)
    assert [row.value for row in rows[:80]] == [event[1] for event in events[:80]]
    assert [row.identity for row in rows[:80]] == [event[2] for event in events[:80]]
    assert [(row.key, row.value, row.identity) for row in rows[80:]] == [
        (None, b"no key, no identity", None), (b"", b"empty key, none to name", None)]
    with pytest.raises(RuntimeError, match="in use by another process"):
        Intake(spool)
    again.append(events[80:])
    again.close()  # a clean stop moves the rest
    assert spool.depth() == 102 and intake_depth(spool.path) == 0
    Intake(spool).close()  # and a start after it finds nothing twice
    assert spool.depth() == 102


def test_event_identity():
    assert event_identity(b'{"source": "//s", "id": "e1", "data": {"x": [1, 2]}}') == ("//s", "e1")
    assert event_identity(b'{"source": "//s", "id": 7}') is None
    assert event_identity(b'[1, 2]') is None
    assert event_identity(b'not json') is None


class AckingProducer:
    """Acknowledges everything on flush (a broker that takes every event, then perhaps loses them)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.queued: list = []

    def produce(self, topic, value, key=None, headers=None, on_delivery=None) -> None:
        self.sent.append(value)
        self.queued.append(on_delivery)

    def poll(self, timeout_s: float = 0) -> None:
        self.flush(timeout_s)

    def flush(self, timeout_s: float = 30) -> int:
        for on_delivery in self.queued:
            on_delivery(None, None)
        self.queued = []
        return 0

    def close(self, timeout_s: float = 5) -> None:
        pass


class RefusingOnceProducer(AckingProducer):
    """Refuses the first delivery of each value starting with b"refuse", acknowledges the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[bytes] = set()

    def produce(self, topic, value, key=None, headers=None, on_delivery=None) -> None:
        if value.startswith(b"refuse") and value not in self.refused:
            self.refused.add(value)
            self.sent.append(value)
            self.queued.append(lambda _err, _msg, report=on_delivery: report(DeliveryFailed("broker said no"), None))
            return
        super().produce(topic, value, key, headers, on_delivery)


def _rows_ever_inserted(spool: Spool) -> int:
    with sqlite3.connect(spool.path) as conn:
        found = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'spooled_events'").fetchone()
    return 0 if found is None else found[0]


def test_broker_ack_publishes_straight_from_the_intake_and_spools_only_what_failed(tmp_path):
    """The emitter's setup (an intake, broker ack): acknowledged events never become spool rows; a
    refused one goes into the spool and is published from there in a later round."""
    spool = Spool(tmp_path / "d.sqlite3", checkpoints="publisher")
    intake = Intake(spool)
    producer = RefusingOnceProducer()
    outbox = Outbox(spool, topic="t", bootstrap="b:1", producer_factory=lambda _b: producer, ack="broker",
                    intake=intake, linger_s=0.05, idle_wait_s=5.0)
    outbox.start()
    try:
        intake.append([(b"k", b"ok %d" % n, ("//s", f"a{n}")) for n in range(40)])
        outbox.wake()
        assert outbox.wait_drained(10)
        assert _rows_ever_inserted(spool) == 0 and len(producer.sent) == 40
        intake.append([(b"k", b"ok 40", ("//s", "a40")), (b"k", b"refuse 41", ("//s", "a41"))])
        outbox.wake()  # woken by the append (the idle wait is 5 s): published within the linger
        assert outbox.wait_drained(10), outbox.last_error
        assert _rows_ever_inserted(spool) == 1  # the refused one, published from the spool the next time
        assert sorted(producer.sent[40:]) == [b"ok 40", b"refuse 41", b"refuse 41"]
    finally:
        outbox.close()
        intake.close()
        spool.close()


def test_metered_rows_stay_until_confirmed_and_go_again_after_the_timeout(tmp_path):
    producer = AckingProducer()
    recorded: set[tuple[str, str]] = set()
    asked: list[int] = []

    def confirm(keys, since):
        asked.append(len(keys))
        return {k for k in keys if k in recorded}

    spool = Spool(tmp_path / "o.sqlite3")
    outbox = Outbox(spool, topic="t", bootstrap="b:1", producer_factory=lambda _b: producer, ack="metered",
                    confirm=confirm, ack_timeout_s=1.0, confirm_every_s=0.05, confirm_batch=40)
    values = [request_event(i) for i in range(100)]
    spool.append_many([(b"k", v) for v in values])
    spool.append(b"k", b'{"no": "identity"}')  # metering dead-letters it without a key: the ack is all
    outbox.start()
    try:
        deadline = time.monotonic() + 5
        while len(producer.sent) < 101 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(producer.sent) == 101
        time.sleep(0.3)
        assert spool.counts() == (0, 100)  # published, not forgotten: metering has none of them
        assert asked and max(asked) <= 40  # asked in batches
        recorded.update(event_identity(v) for v in values[:60])
        deadline = time.monotonic() + 5
        while spool.depth() > 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spool.depth() == 40 and outbox.confirmed == 60 and outbox.unconfirmable == 1
        # the broker "lost" the other 40: after the timeout they are published again
        deadline = time.monotonic() + 5
        while len(producer.sent) < 141 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(producer.sent[101:141]) == sorted(values[60:])
        assert outbox.republished >= 40
        recorded.update(event_identity(v) for v in values[60:])
        assert outbox.wait_drained(5)
    finally:
        outbox.close()
        spool.close()


def test_a_restart_confirms_what_metering_has_and_republishes_the_rest(tmp_path):
    path = tmp_path / "o.sqlite3"
    values = [request_event(i) for i in range(50)]
    spool = Spool(path)
    spool.append_many([(b"k", v) for v in values])
    spool.claim(50)  # published by a process that then died
    spool.close()
    recorded = {event_identity(v) for v in values[:30]}
    producer = AckingProducer()
    spool = Spool(path)
    outbox = Outbox(spool, topic="t", bootstrap="b:1", producer_factory=lambda _b: producer, ack="metered",
                    confirm=lambda keys, since: {k for k in keys if k in recorded}, ack_timeout_s=600,
                    confirm_every_s=0.05)
    outbox.start()
    try:
        deadline = time.monotonic() + 5
        while len(producer.sent) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert sorted(producer.sent) == sorted(values[30:])  # not the 30 metering already has
        recorded.update(event_identity(v) for v in values[30:])
        assert outbox.wait_drained(5)
    finally:
        outbox.close()
        spool.close()


def test_handled_event_keys_are_the_recorded_and_the_dead_lettered(settings):
    from tests.metering.conftest import meter

    bad = request_event(2, cached=500, input_tokens=10)  # cached_exceeds_input: dead-lettered with its key
    counts = meter(settings, [request_event(1), bad])
    assert (counts.accepted, counts.rejected) == (1, 1)
    with psycopg.connect(to_libpq_url(settings.database_url)) as conn:
        keys = [("//test/gw", "r-1"), ("//test/gw", "r-2"), ("//test/gw", "r-3")]
        assert handled_event_keys(conn, keys) == {("//test/gw", "r-1"), ("//test/gw", "r-2")}
        assert handled_event_keys(conn, keys, since=time.time() + 3600) == {("//test/gw", "r-1")}
        assert handled_event_keys(conn, []) == set()


def test_a_broker_that_lost_acknowledged_events_costs_nothing(settings, tmp_path):
    """Real broker, real metering: the broker acknowledges 400 events and dies before metering
    consumed any; a new one comes up on the same address. The outbox publishes them again after
    the ack timeout; metering records each exactly once and the spool empties."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    local = settings.model_copy(update={"kafka_bootstrap": bootstrap})
    broker = start_tansu(port=port, log_path=tmp_path / "a.log")
    ensure_topics(bootstrap, local)
    spool = Spool(tmp_path / "o.sqlite3")
    outbox = Outbox(
        spool, topic=local.events_topic, bootstrap=bootstrap, ack="metered",
        producer_factory=lambda b: make_producer(b, idempotent=False, connect_timeout_s=None),
        confirm=MeteringConfirmer(local.database_url), ack_timeout_s=2.0, confirm_every_s=0.2,
        stall_timeout_s=2.0, ensure_topic=lambda b: ensure_topics(b, local),
    )
    values = [request_event(i, customer=f"c{i % 3}") for i in range(400)]
    spool.append_many([(f"c{i % 3}".encode(), v) for i, v in enumerate(values)])
    outbox.start()
    consumer = thread = None
    try:
        deadline = time.monotonic() + 15
        while spool.counts()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spool.counts() == (0, 400)  # all acknowledged by the broker, none metered
        broker.stop()  # memory-only: the 400 are gone with it
        broker = start_tansu(port=port, log_path=tmp_path / "b.log")
        ensure_topics(bootstrap, local)
        consumer = MeteringConsumer(local, local.database_url, bootstrap, retention_clock=retention_clock)
        thread = run_in_thread(consumer)
        assert outbox.wait_drained(60), outbox.last_error
        assert outbox.republished >= 400
    finally:
        outbox.close()
        spool.close()
        if consumer is not None:
            consumer.stop()
            thread.join(30)
        broker.stop()
    with psycopg.connect(to_libpq_url(local.database_url)) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT event_id) FROM raw_events").fetchone() == (400, 400)
        assert conn.execute("SELECT sum(requests) FROM request_rollup_hourly").fetchone()[0] == 400


def test_the_api_with_metered_ack_spools_before_answering_and_forgets_once_metered(settings):
    from fastapi.testclient import TestClient

    from app.api import create_app
    from tests.metering.conftest import dsn

    local = settings.model_copy(update={"ack": "metered", "ack_check_interval_s": 0.1})
    ensure_topics(local.kafka_bootstrap, local)
    body = b"[" + b",".join(request_event(i, customer="cust-a") for i in range(20)) + b"]"
    with TestClient(create_app(local, local.database_url, local.kafka_bootstrap)) as client:
        publisher = client.app.state.publisher
        publisher.outbox.close()  # no publishing yet: the answer must not wait for the broker
        answer = client.post("/v1/events", content=body, headers={
            "Authorization": f"Bearer {local.producer_token}", "Content-Type": "application/cloudevents-batch+json"})
        assert answer.status_code == 202, answer.text
        assert answer.json()["published"] == 20
        assert publisher.outbox.spool.counts() == (20, 0)  # durable, not yet published
        publisher.outbox.start()
        consumer = MeteringConsumer(local, local.database_url, local.kafka_bootstrap, retention_clock=retention_clock)
        thread = run_in_thread(consumer)
        try:
            assert publisher.outbox.wait_drained(30), publisher.outbox.last_error
        finally:
            consumer.stop()
            thread.join(30)
    with psycopg.connect(dsn(local)) as conn:
        assert conn.execute("SELECT sum(requests) FROM request_rollup_hourly").fetchone()[0] == 20
