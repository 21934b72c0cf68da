"""The Kafka contract: every test runs once per backend (confluent, kafka-python) on the real broker.

Offsets live outside Kafka (in Postgres, in the real consumer); here an `OffsetStore` plays that part:
a consumer records "next offset" per partition after it has processed a message, and on_assign
answers from it, exactly as the metering consumer does with its consumer_offsets table.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from infermeter.settings import Settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.ports import free_port
from metering import kafka as mk
from tests.kafka.helpers import consume_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.waits]  # consumer-group joins: tests/conftest.py


def produce_keyed(bootstrap: str, backend: str, topic: str, count: int, *, keys: int = 40, start: int = 0):
    """Produce `count` keyed messages with headers; return their delivery reports (all must succeed)."""
    producer = mk.make_producer(bootstrap, backend)
    reports: list[tuple[Exception | None, mk.Message | None]] = []
    try:
        for i in range(start, start + count):
            headers = {"seq": str(i).encode(), "type": b"infermeter.request.v1"} if i % 3 else None
            producer.produce(
                topic,
                f'{{"n": {i}}}'.encode(),
                key=f"customer-{i % keys}".encode(),
                headers=headers,
                on_delivery=lambda err, msg: reports.append((err, msg)),
            )
            if i % 100 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
    finally:
        producer.close()
    assert len(reports) == count
    assert [err for err, _ in reports if err is not None] == []
    return [msg for _, msg in reports]


def identity(m: mk.Message) -> tuple:
    return (m.partition, m.offset, m.key, m.value, tuple(sorted(m.headers.items())))


class OffsetStore:
    """Stands in for the consumer_offsets table: next offset to read, per partition."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_offset: dict[mk.TopicPartition, int] = {}
        self.processed: list[tuple[str, mk.Message]] = []

    def on_assign(self, partitions: list[mk.TopicPartition]) -> dict[mk.TopicPartition, int]:
        with self.lock:
            return {tp: self.next_offset[tp] for tp in partitions if tp in self.next_offset}

    def process(self, member: str, messages: list[mk.Message]) -> None:
        with self.lock:
            for m in messages:
                self.processed.append((member, m))
                self.next_offset[mk.TopicPartition(m.topic, m.partition)] = m.offset + 1

    def count(self) -> int:
        with self.lock:
            return len(self.processed)


def test_keyed_messages_round_trip_with_delivery_reports(kafka_bootstrap, backend, topic):
    delivered = produce_keyed(kafka_bootstrap, backend, topic, 400)

    # Delivery reports: real offsets, each key on exactly one partition, offsets unique per partition.
    partitions_of_key = defaultdict(set)
    for m in delivered:
        assert m.topic == topic and m.offset >= 0 and 0 <= m.partition < 4
        partitions_of_key[m.key].add(m.partition)
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert len({(m.partition, m.offset) for m in delivered}) == 400
    assert {m.partition for m in delivered} == {0, 1, 2, 3}

    reader = mk.make_assigned_consumer(
        kafka_bootstrap, backend=backend, offsets={tp: 0 for tp in mk.list_partitions(kafka_bootstrap, topic)}
    )
    try:
        consumed = consume_until(reader, 400)
    finally:
        reader.close()

    assert len(consumed) == 400
    assert sorted(map(identity, consumed)) == sorted(map(identity, delivered))
    for m in consumed:
        assert isinstance(m.headers, dict)
        assert m.timestamp_ms is not None and abs(m.timestamp_ms / 1000 - time.time()) < 600
        n = int(m.value[6:-1])
        assert m.key == f"customer-{n % 40}".encode()
        assert m.headers == ({"seq": str(n).encode(), "type": b"infermeter.request.v1"} if n % 3 else {})
    # Order is kept per key.
    by_key = defaultdict(list)
    for m in sorted(consumed, key=lambda m: (m.partition, m.offset)):
        by_key[m.key].append(int(m.value[6:-1]))
    assert all(seq == sorted(seq) for seq in by_key.values())


def test_on_assign_offsets_are_honoured(kafka_bootstrap, backend, topic, group_id):
    delivered = produce_keyed(kafka_bootstrap, backend, topic, 200)
    per_partition = Counter(m.partition for m in delivered)
    assert min(per_partition.values()) >= 10, per_partition

    starts = {
        mk.TopicPartition(topic, 0): 5,  # skip the first five
        mk.TopicPartition(topic, 1): 0,  # explicit zero
        mk.TopicPartition(topic, 2): per_partition[2],  # fully processed already: nothing to read
        # partition 3 left out: earliest
    }
    calls: list[list[mk.TopicPartition]] = []

    def on_assign(partitions):
        calls.append(sorted(partitions, key=lambda tp: tp.partition))
        return {tp: starts[tp] for tp in partitions if tp in starts}

    consumer = mk.make_consumer(
        kafka_bootstrap, backend=backend, group_id=group_id, topics=[topic], on_assign=on_assign
    )
    expected = [m for m in delivered if m.offset >= starts.get(mk.TopicPartition(topic, m.partition), 0)]
    try:
        consumed = consume_until(consumer, len(expected))
        assert sorted(consumer.assignment(), key=lambda tp: tp.partition) == [
            mk.TopicPartition(topic, p) for p in range(4)
        ]
    finally:
        consumer.close()

    assert calls == [[mk.TopicPartition(topic, p) for p in range(4)]]
    assert len(consumed) == len(expected)
    assert sorted(map(identity, consumed)) == sorted(map(identity, expected))


def test_slow_on_assign_runs_on_the_callers_thread_and_keeps_the_membership(
    kafka_bootstrap, backend, topic, group_id
):
    """on_assign may block (the metering consumer retries Postgres in it): it runs on the thread that
    calls poll_batch, heartbeats go on meanwhile, and the member is not evicted (evicted = a second
    assignment)."""
    delivered = produce_keyed(kafka_bootstrap, backend, topic, 100)
    calls: list[str] = []

    def slow_on_assign(partitions):
        calls.append(threading.current_thread().name)
        time.sleep(7.5)  # longer than session_timeout_ms (6 s)
        return {}

    consumer = mk.make_consumer(
        kafka_bootstrap, backend=backend, group_id=group_id, topics=[topic], on_assign=slow_on_assign
    )
    try:
        consumed = consume_until(consumer, 100, timeout_s=40)
        consumed += consumer.poll_batch(1000, 2.0)  # past another heartbeat round: still a member?
    finally:
        consumer.close()
    assert calls == [threading.current_thread().name]
    assert sorted(map(identity, consumed)) == sorted(map(identity, delivered))


def _member(bootstrap, backend, topic, group_id, name, store, stop, assignments, revoked):
    consumer = mk.make_consumer(
        bootstrap,
        backend=backend,
        group_id=group_id,
        topics=[topic],
        on_assign=store.on_assign,
        on_revoke=lambda tps: revoked[name].append(tps),
        client_id=name,
    )
    try:
        while not stop.is_set():
            batch = consumer.poll_batch(500, 0.1)
            store.process(name, batch)
            assignments[name] = {tp.partition for tp in consumer.assignment()}
    finally:
        consumer.close()


def test_two_consumers_in_one_group_split_partitions_without_duplicates(
    kafka_bootstrap, backend, topic, group_id
):
    store, stop = OffsetStore(), threading.Event()
    assignments: dict[str, set[int]] = {}
    revoked: dict[str, list] = defaultdict(list)
    first = produce_keyed(kafka_bootstrap, backend, topic, 200)

    with ThreadPoolExecutor(2) as pool:
        members = [
            pool.submit(
                _member, kafka_bootstrap, backend, topic, group_id, "a", store, stop, assignments, revoked
            )
        ]
        deadline = time.monotonic() + 30
        while store.count() < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.count() == 200
        assert assignments["a"] == {0, 1, 2, 3}

        # A second member joins while more messages keep arriving.
        members.append(
            pool.submit(
                _member, kafka_bootstrap, backend, topic, group_id, "b", store, stop, assignments, revoked
            )
        )
        second = []
        for chunk in range(8):
            second += produce_keyed(kafka_bootstrap, backend, topic, 50, start=200 + 50 * chunk)
            time.sleep(0.25)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            store.count() >= 600 and assignments.get("a") and assignments.get("b")
        ):
            time.sleep(0.05)
        time.sleep(0.5)  # room for duplicates to show up, if any
        split = dict(assignments)
        stop.set()
        for member in members:
            member.result(timeout=30)

    processed = [(member, identity(m)) for member, m in store.processed]
    messages = [ident for _, ident in processed]
    assert len(messages) == len(set(messages)), "a message was processed twice"
    assert sorted(messages) == sorted(map(identity, first + second))
    assert (
        split["a"] and split["b"] and not split["a"] & split["b"] and split["a"] | split["b"] == {0, 1, 2, 3}
    )
    # Both members did work after the split, each only on its own partitions.
    late = {identity(m) for m in second}
    for member in ("a", "b"):
        assert any(who == member and ident in late for who, ident in processed)
    assert revoked["a"], "the first member was told before its partitions went away"


def test_new_member_resumes_from_on_assign_offsets(kafka_bootstrap, backend, topic, group_id):
    delivered = produce_keyed(kafka_bootstrap, backend, topic, 200)
    store = OffsetStore()
    revoked: list[list[mk.TopicPartition]] = []

    first = mk.make_consumer(
        kafka_bootstrap,
        backend=backend,
        group_id=group_id,
        topics=[topic],
        on_assign=store.on_assign,
        on_revoke=revoked.append,
    )
    try:
        deadline = time.monotonic() + 30
        while store.count() < 80 and time.monotonic() < deadline:
            store.process("first", first.poll_batch(30, 0.2))
    finally:
        first.close()
    seen_first = store.count()
    assert 80 <= seen_first < 200
    assert revoked and sorted(tp.partition for tp in revoked[-1]) == [0, 1, 2, 3]

    second = mk.make_consumer(
        kafka_bootstrap, backend=backend, group_id=group_id, topics=[topic], on_assign=store.on_assign
    )
    try:
        store.process("second", consume_until(second, 200 - seen_first))
    finally:
        second.close()

    messages = [identity(m) for _, m in store.processed]
    assert len(messages) == 200 == len(set(messages))
    assert sorted(messages) == sorted(map(identity, delivered))


def test_flush_counts_unacknowledged_messages_when_the_broker_is_gone(tmp_path, backend):
    broker = start_tansu(log_path=tmp_path / "tansu.log")
    try:
        name = f"contract-{uuid.uuid4().hex[:10]}"
        mk.create_topic(broker.bootstrap, name, 1, backend=backend)
        producer = mk.make_producer(broker.bootstrap, backend, linger_ms=0)
        producer.produce(name, b"warm-up")
        assert producer.flush(10) == 0
    finally:
        broker.process.kill()  # a crash (a polite stop waits 5 s for open connections)
        broker.process.wait(10)

    reports = []
    for i in range(5):
        producer.produce(name, b"%d" % i, on_delivery=lambda err, msg: reports.append(err))
    started = time.monotonic()
    assert producer.flush(1.5) == 5
    assert time.monotonic() - started < 5
    assert None not in reports  # nothing reported as delivered
    producer.close(timeout_s=1)


def test_publish_and_wait_acknowledges_every_message_and_reports_which(kafka_bootstrap, backend, topic):
    producer = mk.make_producer(kafka_bootstrap, backend)
    progress: list[int] = []
    try:
        items = [(f"customer-{i % 7}".encode(), f'{{"n": {i}}}'.encode()) for i in range(300)]
        tracked = mk.publish_and_wait(producer, topic, items, headers={"ingest": b"a"}, track_acked=True)
        counted = mk.publish_and_wait(
            producer, topic, iter(items[:250]), progress_every=100, on_progress=progress.append
        )
    finally:
        producer.close()

    assert tracked.ok and counted.ok
    assert (tracked.published, tracked.acked, tracked.unacknowledged, tracked.failures) == (300, 300, 0, [])
    assert sorted(tracked.acked_positions) == list(range(300))
    assert (counted.published, counted.acked, counted.acked_positions) == (250, 250, None)
    assert progress == [100, 200]
    assert not (tracked.timed_out or tracked.stalled or tracked.stopped) and tracked.error is None

    reader = mk.make_assigned_consumer(
        kafka_bootstrap, backend=backend, offsets={tp: 0 for tp in mk.list_partitions(kafka_bootstrap, topic)}
    )
    try:
        consumed = consume_until(reader, 550)
    finally:
        reader.close()
    assert len(consumed) == 550
    with_header = [m for m in consumed if m.headers == {"ingest": b"a"}]
    assert sorted((m.key, m.value) for m in with_header) == sorted(items)
    assert sorted((m.key, m.value) for m in consumed if not m.headers) == sorted(items[:250])


def test_publish_and_wait_on_a_producer_shared_by_threads(kafka_bootstrap, backend, topic):
    """Each thread waits for its own messages (poll under the shared lock), not for the others'."""
    producer = mk.make_producer(kafka_bootstrap, backend)
    lock = threading.Lock()

    def publish(thread: int) -> mk.PublishResult:
        items = [(f"k{i}".encode(), f"{thread}-{i}".encode()) for i in range(50 * (thread + 1))]
        return mk.publish_and_wait(producer, topic, items, timeout_s=20, poll_every_s=0.05, shared_lock=lock)

    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(publish, range(8)))
    finally:
        producer.close()
    assert [(r.published, r.acked, r.unacknowledged, r.ok) for r in results] == [
        (50 * (t + 1), 50 * (t + 1), 0, True) for t in range(8)
    ]


def test_publish_and_wait_ends_the_wait_when_the_broker_is_gone(tmp_path, backend):
    """With the broker gone nothing is acknowledged: the wait ends on the deadline, on a stall (no
    report at all) or on `stop`, and says so; errors="report" turns client errors into a result."""
    broker = start_tansu(log_path=tmp_path / "tansu.log")
    try:
        name = f"contract-{uuid.uuid4().hex[:10]}"
        mk.create_topic(broker.bootstrap, name, 1, backend=backend)
        producer = mk.make_producer(broker.bootstrap, backend, linger_ms=0, idempotent=False)
        assert mk.publish_and_wait(producer, name, [(None, b"warm-up")], timeout_s=10).ok
    finally:
        broker.process.kill()
        broker.process.wait(10)

    items = [(b"k", b"%d" % i) for i in range(5)]
    try:
        started = time.monotonic()
        timed_out = mk.publish_and_wait(producer, name, items, timeout_s=1.0, poll_every_s=0.2)
        assert 1.0 <= time.monotonic() - started < 4
        assert timed_out.timed_out and not timed_out.ok
        assert (timed_out.published, timed_out.acked, timed_out.unacknowledged) == (5, 0, 5)

        started = time.monotonic()
        stalled = mk.publish_and_wait(
            producer, name, items, timeout_s=None, stall_timeout_s=1.0, poll_every_s=0.2,
            errors="report", track_acked=True,
        )
        assert 1.0 <= time.monotonic() - started < 4
        assert stalled.stalled and stalled.acked_positions == [] and stalled.acked == 0
        assert stalled.unacknowledged + len(stalled.failures) == 5
        assert stalled.error is not None and "no delivery report for 1 s" in stalled.error

        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        stopped = mk.publish_and_wait(
            producer, name, items, timeout_s=None, poll_every_s=0.2, stop=stop, stop_grace_s=0.5
        )
        assert time.monotonic() - started < 4
        assert stopped.stopped and stopped.acked == 0 and not stopped.ok
    finally:
        producer.close(timeout_s=1)


def test_publish_and_wait_reports_or_raises_a_produce_error(kafka_bootstrap, backend, topic):
    class Broken:
        """A producer whose queue refuses the third message (stands in for a client in a fatal state)."""

        def __init__(self, inner: mk.Producer) -> None:
            self.inner, self.count = inner, 0
            self.poll, self.flush = inner.poll, inner.flush

        def produce(self, *args, **kwargs) -> None:
            self.count += 1
            if self.count == 3:
                raise mk.KafkaError("queue refused")
            self.inner.produce(*args, **kwargs)

    producer = mk.make_producer(kafka_bootstrap, backend)
    items = [(b"k", b"%d" % i) for i in range(5)]
    try:
        reported = mk.publish_and_wait(Broken(producer), topic, items, errors="report", track_acked=True)
        assert reported.produce_error is not None and reported.error == "produce failed: queue refused"
        assert (reported.published, reported.acked, sorted(reported.acked_positions)) == (2, 2, [0, 1])
        with pytest.raises(mk.KafkaError, match="queue refused"):
            mk.publish_and_wait(Broken(producer), topic, items)
    finally:
        producer.close()


def test_ensure_topics_is_idempotent_and_safe_concurrently(kafka_bootstrap, backend):
    settings = Settings(
        KAFKA_BOOTSTRAP=kafka_bootstrap,
        INFERMETER_TOPIC_PREFIX=f"contract-{uuid.uuid4().hex[:10]}",
        INFERMETER_TOPIC_PARTITIONS=3,
        INFERMETER_KAFKA_BACKEND=backend,
    )
    with ThreadPoolExecutor(3) as pool:
        for result in [pool.submit(mk.ensure_topics, kafka_bootstrap, settings) for _ in range(3)]:
            result.result(timeout=30)
    mk.ensure_topics(kafka_bootstrap, settings)

    assert mk.list_partitions(kafka_bootstrap, settings.events_topic, backend=backend) == [
        mk.TopicPartition(settings.events_topic, p) for p in range(3)
    ]
    assert len(mk.list_partitions(kafka_bootstrap, settings.dead_letter_topic, backend=backend)) == 1
    assert mk.list_partitions(kafka_bootstrap, settings.topic_prefix + ".absent", backend=backend) == []
    # Reading metadata did not create the topic it asked about.
    assert mk.list_partitions(kafka_bootstrap, settings.topic_prefix + ".absent", backend=backend) == []


def test_unreachable_broker_fails_fast_with_a_clear_error(backend):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    attempts = {
        "producer": lambda: mk.make_producer(address, backend, connect_timeout_s=1),
        "consumer": lambda: mk.make_consumer(
            address,
            backend=backend,
            group_id="g",
            topics=["t"],
            on_assign=lambda tps: {},
            connect_timeout_s=1,
        ),
        "create_topic": lambda: mk.create_topic(address, "t", 1, backend=backend, timeout_s=1),
    }
    for what, attempt in attempts.items():
        started = time.monotonic()
        with pytest.raises(mk.KafkaUnavailable, match=f"{address} is not reachable"):
            attempt()
        assert time.monotonic() - started < 8, what


def test_same_key_same_partition_whichever_backend_produced(kafka_bootstrap):
    name = f"contract-{uuid.uuid4().hex[:10]}"
    mk.create_topic(kafka_bootstrap, name, 8)
    partition_of = {
        backend: {m.key: m.partition for m in produce_keyed(kafka_bootstrap, backend, name, 64, keys=64)}
        for backend in mk.BACKENDS
    }
    assert partition_of["confluent"] == partition_of["kafka-python"]
    assert len(set(partition_of["confluent"].values())) > 4


def test_unknown_backend_is_refused(kafka_bootstrap):
    with pytest.raises(mk.UnknownBackend, match="confluent, kafka-python"):
        mk.make_producer(kafka_bootstrap, "aiokafka")


def test_kafka_python_checks_crcs_in_c():
    """kafka-python verifies CRC-32C of every record batch; in pure Python that caps it at ~15k msg/s.
    The `crc32c` dependency gives it the C implementation."""
    from kafka.record import util

    assert util.crc32c_c is not None
    assert util.calc_crc32c(memoryview(b"123456789")) == 0xE3069283  # the CRC-32C check value
