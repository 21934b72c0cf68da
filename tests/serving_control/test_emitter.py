"""The emitter: spool first, Kafka after; nothing lost to kill -9 or to a broker outage."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infermeter.settings import Settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.ports import free_port
from metering.contract import encode_event
from metering.intake import intake_depth
from metering.kafka import ensure_topics
from metering.spool import Spool
from serving import metrics
from serving.emitter import Emitter
from tests.serving_control.emit_child import request_event
from tests.serving_control.kafka_helpers import identities, read_events

REPO = Path(__file__).resolve().parents[2]


def test_spool_survives_reopen_and_acks_delete(tmp_path):
    spool = Spool(tmp_path / "s.sqlite3")
    seqs = [spool.append(b"k", f"v{i}".encode()) for i in range(5)]
    spool.append_many([(None, b"x"), (b"k2", b"y")])
    spool.close()
    spool = Spool(tmp_path / "s.sqlite3")
    assert spool.depth() == 7
    assert [e.value for e in spool.peek(3)] == [b"v0", b"v1", b"v2"]
    assert spool.ack(seqs[:2]) == 2
    assert spool.depth() == 5 and spool.peek(1)[0].value == b"v2"
    assert spool.oldest_enqueued_at() is not None
    spool.close()


def test_events_reach_the_topic_exactly_as_emitted(settings, kafka_bootstrap, tmp_path):
    ensure_topics(kafka_bootstrap, settings)
    events = [request_event(i) for i in range(300)]
    with Emitter(tmp_path / "spool", kafka_bootstrap, settings, name="exact") as emitter:
        for event in events:
            emitter.emit(event)
        assert emitter.wait_drained(30), emitter.last_error
    records = read_events(kafka_bootstrap, settings.events_topic, len(events))
    assert sorted(v for _, v in records) == sorted(encode_event(e) for e in events)
    assert all(key == orjson_subject(value) for key, value in records)


def spooled(path: Path) -> int:
    """What a restart of the emitter of spool `path` would find: its rows and its intake's events."""
    spool = Spool(path)
    try:
        return spool.depth() + intake_depth(path)
    finally:
        spool.close()


def test_events_emitted_in_one_loop_iteration_are_spooled_in_one_append(
    settings, kafka_bootstrap, tmp_path, monkeypatch
):
    """The gateway's request events (`emit_batched` on its event loop): the events of one iteration
    are appended together, in one write, before the loop runs anything scheduled after them; the
    publisher sees each."""
    ensure_topics(kafka_bootstrap, settings)
    events = [request_event(i) for i in range(5)]
    emitter = Emitter(tmp_path / "spool", kafka_bootstrap, settings, name="loop")
    appends: list[int] = []
    append = emitter.intake.append
    monkeypatch.setattr(emitter.intake, "append", lambda items: appends.append(len(items)) or append(items))
    path = tmp_path / "spool" / "loop.sqlite3"

    async def requests_finishing_in_one_iteration() -> tuple[int, int]:
        for event in events:
            emitter.emit_batched(event)
        gathered = spooled(path)
        await asyncio.sleep(0)  # anything scheduled from here on runs after the append
        return gathered, spooled(path)

    assert asyncio.run(requests_finishing_in_one_iteration()) == (0, 5)
    assert appends == [5]
    with emitter:
        assert emitter.wait_drained(30), emitter.last_error
    records = read_events(kafka_bootstrap, settings.events_topic, len(events))
    assert sorted(v for _, v in records) == sorted(encode_event(e) for e in events)


def test_close_spools_what_the_loop_gathered(settings, tmp_path):
    """An event gathered on a loop that stops before its append still reaches the spool on close."""
    emitter = Emitter(tmp_path / "spool", "127.0.0.1:9", settings, name="gathered")
    loop = asyncio.new_event_loop()

    def emit_then_stop() -> None:
        emitter.emit_batched(request_event(1))
        loop.stop()  # this iteration is the loop's last: the append scheduled by emit never runs

    loop.call_soon(emit_then_stop)
    loop.run_forever()
    loop.close()
    assert emitter.depth() == 0
    emitter.close()
    spool = Spool(tmp_path / "spool" / "gathered.sqlite3")
    assert [e.identity for e in spool.peek(10)] == [("//gateway/test-child", "req-1")]
    spool.close()


def test_the_publisher_checkpoints_the_gateway_spool(settings, kafka_bootstrap, tmp_path):
    """The emitter's appends leave SQLite's checkpoints to its publisher thread, which runs them."""
    ensure_topics(kafka_bootstrap, settings)
    emitter = Emitter(tmp_path / "spool", kafka_bootstrap, settings, name="ckpt")
    for i in range(300):
        emitter.emit(request_event(i))
    database = tmp_path / "spool" / "ckpt.sqlite3"
    appended = database.stat().st_size  # everything is still in the WAL
    with emitter:
        deadline = time.monotonic() + 10
        while database.stat().st_size == appended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert database.stat().st_size > appended
        assert emitter.wait_drained(30), emitter.last_error


def orjson_subject(value: bytes) -> bytes:
    import orjson

    return orjson.loads(value)["subject"].encode()


def _child(spool_dir: Path, bootstrap: str, settings: Settings, name: str, first: int, count: int):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.serving_control.emit_child", str(spool_dir), bootstrap,
         settings.topic_prefix, name, str(first), str(count)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    line = process.stdout.readline()
    assert line.strip() == "emitted", f"child said {line!r}"
    return process


def test_kill_9_loses_nothing_already_emitted(settings, kafka_bootstrap, tmp_path):
    ensure_topics(kafka_bootstrap, settings)
    spool_dir = tmp_path / "spool"
    # 1. a gateway emits 3000 events with the broker up and is killed while still publishing
    child = _child(spool_dir, kafka_bootstrap, settings, "gw", 0, 3000)
    path = spool_dir / "gw.sqlite3"
    deadline = time.monotonic() + 10
    while spooled(path) == 3000 and time.monotonic() < deadline:  # kill once publishing has begun
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left_after_first = spooled(path)
    # 2. it restarts with Kafka unreachable, emits 500 more and is killed again: all 500 spooled
    child = _child(spool_dir, f"127.0.0.1:{free_port()}", settings, "gw", 3000, 500)
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert spooled(path) == left_after_first + 500
    # 3. restarted with the broker: the spool is replayed; every event is on the topic
    with Emitter(spool_dir, kafka_bootstrap, settings, name="gw") as emitter:
        assert emitter.wait_drained(60), emitter.last_error
    seen = identities(read_events(kafka_bootstrap, settings.events_topic, 3500, timeout_s=60))
    assert set(seen) == {("//gateway/test-child", f"req-{i}") for i in range(3500)}
    print(f"spooled after first kill: {left_after_first}; on topic: {len(seen)} (duplicates: {len(seen) - 3500})")


def test_broker_outage_grows_the_spool_then_drains_without_loss(tmp_path, unique_name):
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    settings = Settings(INFERMETER_TOPIC_PREFIX=unique_name, KAFKA_BOOTSTRAP=bootstrap)
    emitter = Emitter(tmp_path / "spool", bootstrap, settings, name="outage").start()
    broker = None
    try:
        for i in range(200):
            emitter.emit(request_event(i))
        time.sleep(1.5)
        assert emitter.depth() == 200  # nothing can be published: all spooled
        emitter.emit_many(request_event(i) for i in range(200, 400))
        time.sleep(0.5)
        assert emitter.depth() == 400
        text = metrics.render().decode()
        assert 'infermeter_emitter_spool_depth{spool="outage"} 400.0' in text
        lag = [line for line in text.splitlines() if line.startswith('infermeter_emitter_publish_lag_seconds{spool="outage"}')]
        assert lag and float(lag[0].split()[-1]) >= 1.0
        # the broker comes (back) on that address
        broker = start_tansu(port=port, log_path=tmp_path / "tansu.log")
        ensure_topics(bootstrap, settings)
        assert emitter.wait_drained(60), emitter.last_error
        emitter.emit(request_event(400))
        assert emitter.wait_drained(10)
        seen = identities(read_events(bootstrap, settings.events_topic, 401, timeout_s=30))
        assert set(seen) == {("//gateway/test-child", f"req-{i}") for i in range(401)}
        assert 'infermeter_emitter_spool_depth{spool="outage"} 0.0' in metrics.render().decode()
        # the broker dies (memory-only: its log is gone) and a new one comes up on the same port;
        # the producer's idempotence state no longer matches it: the emitter must still deliver
        broker.stop()
        emitter.emit_many(request_event(i) for i in range(1000, 1100))
        time.sleep(1.0)
        assert emitter.depth() == 100
        broker = start_tansu(port=port, log_path=tmp_path / "tansu2.log")
        ensure_topics(bootstrap, settings)
        assert emitter.wait_drained(60), emitter.last_error
        seen = identities(read_events(bootstrap, settings.events_topic, 100, timeout_s=30))
        assert set(seen) == {("//gateway/test-child", f"req-{i}") for i in range(1000, 1100)}
    finally:
        emitter.close()
        if broker:
            broker.stop()


def test_a_stuck_kafka_client_is_replaced_and_the_batch_resent(tmp_path, unique_name):
    """An idempotent producer never recovers on a broker that lost its producer state (a memory-only
    broker restarted on the same address): the stall guard replaces the client and re-sends."""
    from metering.kafka import make_producer

    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    settings = Settings(INFERMETER_TOPIC_PREFIX=unique_name, KAFKA_BOOTSTRAP=bootstrap,
                        INFERMETER_EMITTER_STALL_TIMEOUT_MS=1500)
    broker = start_tansu(port=port, log_path=tmp_path / "a.log")
    ensure_topics(bootstrap, settings)
    emitter = Emitter(tmp_path / "spool", bootstrap, settings, name="stuck",
                      producer_factory=lambda: make_producer(bootstrap, idempotent=True, connect_timeout_s=None))
    emitter.start()
    try:
        emitter.emit_many(request_event(i) for i in range(50))
        assert emitter.wait_drained(20), emitter.last_error
        broker.stop()
        emitter.emit_many(request_event(i) for i in range(50, 100))
        time.sleep(0.5)
        broker = start_tansu(port=port, log_path=tmp_path / "b.log")
        ensure_topics(bootstrap, settings)
        assert emitter.wait_drained(30), emitter.last_error
        assert "no delivery report" in (emitter.last_error or "")
        seen = identities(read_events(bootstrap, settings.events_topic, 50, timeout_s=20))
        assert set(seen) == {("//gateway/test-child", f"req-{i}") for i in range(50, 100)}
    finally:
        emitter.close()
        broker.stop()


class ScriptedProducer:
    """A producer whose delivery reports follow a script per message value: b"ok" is acknowledged,
    b"fail" refused, b"never" never reported, b"boom" makes produce raise. Reports are served in
    flush, on the caller's thread, as the real backends do."""

    def __init__(self) -> None:
        self.queued: list = []
        self.flushes: list[float] = []

    def produce(self, topic, value, key=None, headers=None, on_delivery=None) -> None:
        if value == b"boom":
            raise RuntimeError("queue is full")
        self.queued.append((value, on_delivery))

    def poll(self, timeout_s: float = 0) -> None:
        self.flush(timeout_s)

    def flush(self, timeout_s: float = 30) -> int:
        from metering.kafka_types import DeliveryFailed

        self.flushes.append(timeout_s)
        kept = []
        for value, on_delivery in self.queued:
            if value == b"ok":
                on_delivery(None, None)
            elif value == b"fail":
                on_delivery(DeliveryFailed("delivery to t failed: broker said no"), None)
            else:
                kept.append((value, on_delivery))
        self.queued = kept
        return len(kept)

    def close(self, timeout_s: float = 5) -> None:
        pass


def _publish_script(tmp_path, values: list[bytes], *, stall_ms: int = 300, stopping: bool = False):
    settings = Settings(INFERMETER_EMITTER_STALL_TIMEOUT_MS=stall_ms)
    emitter = Emitter(tmp_path / "spool", "127.0.0.1:1", settings, name=f"script-{len(values)}", topic="t")
    try:
        for value in values:
            emitter.spool.append(b"k", value)
        batch = emitter.spool.peek(100)
        if stopping:
            emitter.outbox._round_stop.set()
        producer = ScriptedProducer()
        acked, failed = emitter._publish(producer, batch)
        return [e.seq for e in batch], acked, failed, emitter.last_error, producer
    finally:
        emitter.close()


def test_publish_acks_what_was_acknowledged_and_counts_the_rest_failed(tmp_path):
    seqs, acked, failed, last_error, _ = _publish_script(tmp_path, [b"ok", b"fail", b"ok", b"fail", b"ok"])
    assert sorted(acked) == [seqs[0], seqs[2], seqs[4]] and failed == 2
    assert last_error == "delivery to t failed: broker said no"

    seqs, acked, failed, last_error, producer = _publish_script(tmp_path, [b"ok"] * 3)
    assert sorted(acked) == seqs and failed == 0 and last_error is None
    assert producer.flushes == [0.5]


def test_publish_gives_up_on_a_stalled_client_and_on_a_produce_error(tmp_path):
    started = time.monotonic()
    seqs, acked, failed, last_error, _ = _publish_script(tmp_path, [b"ok", b"never", b"never"], stall_ms=300)
    assert 0.3 <= time.monotonic() - started < 3
    assert acked == [seqs[0]] and failed == 2
    assert last_error == "no delivery report for 0.3 s (2 events)"

    seqs, acked, failed, last_error, _ = _publish_script(tmp_path, [b"ok", b"boom", b"ok", b"ok"])
    assert acked == [seqs[0]] and failed == 3  # the rest of the batch goes again from the spool
    assert last_error == "produce failed: queue is full"


def test_publish_while_closing_leaves_the_unacknowledged_spooled(tmp_path):
    seqs, acked, failed, _, producer = _publish_script(tmp_path, [b"ok", b"never"], stopping=True)
    assert acked == [seqs[0]] and failed == 1
    assert producer.flushes == [0.5, 2.0]  # one round, then a last chance for the messages in flight
