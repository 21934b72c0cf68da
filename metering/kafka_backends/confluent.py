"""confluent-kafka (librdkafka) backend of metering.kafka."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Mapping

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

from metering.kafka_types import (
    MAX_MESSAGE_BYTES,
    AssignCallback,
    DeliveryCallback,
    DeliveryFailed,
    KafkaError,
    KafkaUnavailable,
    Message,
    RevokeCallback,
    TopicPartition,
    new_message,
)

log = logging.getLogger("metering.kafka.confluent")
# librdkafka's own log lines (connection refused, ...) go to logging, not straight to stderr.
_client_log = logging.getLogger("metering.kafka.librdkafka")

_PARTITION_EOF = ck.KafkaError._PARTITION_EOF
_TOPIC_ALREADY_EXISTS = ck.KafkaError.TOPIC_ALREADY_EXISTS
_TIMESTAMP_NOT_AVAILABLE = ck.TIMESTAMP_NOT_AVAILABLE
_OFFSET_BEGINNING = ck.OFFSET_BEGINNING


def _base_config(bootstrap: str, client_id: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "logger": _client_log,
        "error_cb": _log_error,
        "socket.connection.setup.timeout.ms": 5000,
    }


def _log_error(err: ck.KafkaError) -> None:
    # librdkafka retries transient errors itself and already logs them through `logger`.
    if err.fatal():
        log.error("fatal kafka client error: %s", err.str())
    else:
        log.debug("kafka client error: %s", err.str())


def _probe(client, bootstrap: str, timeout_s: float) -> None:
    """Fail fast with KafkaUnavailable when no broker answers a metadata request."""
    try:
        client.list_topics(timeout=timeout_s)
    except ck.KafkaException as exc:
        raise KafkaUnavailable(
            f"Kafka broker at {bootstrap} is not reachable (no answer within {timeout_s:g} s): {exc.args[0]}"
        ) from None


# --- producer ---------------------------------------------------------------------------------


class ConfluentProducer:
    def __init__(
        self,
        bootstrap: str,
        *,
        idempotent: bool,
        linger_ms: int,
        client_id: str,
        connect_timeout_s: float | None,
    ):
        config = _base_config(bootstrap, client_id)
        config.update(
            {
                "acks": "all",
                "enable.idempotence": idempotent,
                "linger.ms": linger_ms,
                "compression.type": "none",
                # Room for oversized events to reach the consumer, which dead-letters them with
                # their reason (the broker's own limit must allow it too; Tansu has none).
                "message.max.bytes": MAX_MESSAGE_BYTES,
                # The Java client's (and kafka-python's) key hashing: a key lands on the same
                # partition whichever backend produced it.
                "partitioner": "murmur2_random",
            }
        )
        self._producer = ck.Producer(config)
        self._bootstrap = bootstrap
        if connect_timeout_s is not None:
            _probe(self._producer, bootstrap, connect_timeout_s)

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        callback = _delivery_adapter(on_delivery, headers) if on_delivery is not None else None
        while True:
            try:
                if headers:
                    self._producer.produce(topic, value, key, headers=headers, on_delivery=callback)
                else:
                    self._producer.produce(topic, value, key, on_delivery=callback)
                return
            except BufferError:
                # Local queue full: serve acks until there is room (back-pressure, never drop).
                self._producer.poll(0.05)

    def poll(self, timeout_s: float = 0) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 30) -> int:
        return self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 5) -> None:
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.warning(
                "producer closed with %d message(s) not acknowledged by %s", remaining, self._bootstrap
            )


def _delivery_adapter(on_delivery: DeliveryCallback, headers: dict[str, bytes] | None):
    # librdkafka does not hand the headers back in delivery reports: keep the ones we sent.
    sent_headers = dict(headers) if headers else {}

    def report(err: ck.KafkaError | None, msg: ck.Message) -> None:
        ts_type, ts = msg.timestamp()
        message = Message(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            sent_headers,
            None if ts_type == _TIMESTAMP_NOT_AVAILABLE else ts,
        )
        if err is not None:
            on_delivery(DeliveryFailed(f"delivery to {msg.topic()} failed: {err.str()}"), message)
        else:
            on_delivery(None, message)

    return report


def make_producer(
    bootstrap: str, *, idempotent: bool, linger_ms: int, client_id: str, connect_timeout_s: float | None
) -> ConfluentProducer:
    return ConfluentProducer(
        bootstrap,
        idempotent=idempotent,
        linger_ms=linger_ms,
        client_id=client_id,
        connect_timeout_s=connect_timeout_s,
    )


# --- consumers --------------------------------------------------------------------------------


def _consumer_config(bootstrap: str, client_id: str, group_id: str) -> dict:
    config = _base_config(bootstrap, client_id)
    config.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # Bigger fetches, fewer round trips: the metering consumer reads in batches of thousands.
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 100000,
        }
    )
    return config


def _to_messages(raw: list[ck.Message]) -> list[Message]:
    out: list[Message] = []
    append = out.append
    for msg in raw:
        err = msg.error()
        if err is not None:
            if err.code() == _PARTITION_EOF:
                continue
            if err.fatal():
                raise KafkaError(f"fatal Kafka consumer error: {err.str()}")
            log.warning("kafka consumer error: %s", err.str())
            continue
        ts_type, ts = msg.timestamp()
        headers = msg.headers()
        append(
            new_message(
                msg.topic(),
                msg.partition(),
                msg.offset(),
                msg.key(),
                msg.value(),
                dict(headers) if headers else {},
                None if ts_type == _TIMESTAMP_NOT_AVAILABLE else ts,
            )
        )
    return out


class ConfluentConsumer:
    def __init__(self, consumer: ck.Consumer):
        self._consumer = consumer
        # Bumped by the rebalance callbacks so poll_batch can tell a rebalance happened during a call.
        self._rebalances = 0
        self._start_offsets: dict[tuple[str, int], int] = {}
        self._closed = False

    def poll_batch(self, max_messages: int, timeout_s: float) -> list[Message]:
        rebalances = self._rebalances
        raw = self._consumer.consume(max_messages, timeout_s)
        if not raw:
            return []
        # A batch allocates thousands of Message objects that all survive until the caller is done:
        # pausing the cyclic GC while building them spares dozens of collections that would find
        # nothing to free (measured: up to ~2x on this loop).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            out = _to_messages(raw)
        finally:
            if paused:
                gc.enable()
        if rebalances != self._rebalances and out:
            out = self._drop_stale(out)
        return out

    def _drop_stale(self, messages: list[Message]) -> list[Message]:
        """After a rebalance inside consume(): keep only messages of partitions still owned and at or
        after the offset on_assign chose (anything else was fetched under the old assignment)."""
        owned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        starts = self._start_offsets
        kept = []
        for m in messages:
            key = (m.topic, m.partition)
            if key in owned and m.offset >= starts.get(key, 0):
                kept.append(m)
        if len(kept) != len(messages):
            log.info("dropped %d message(s) fetched before a rebalance", len(messages) - len(kept))
        return kept

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()


def make_consumer(
    bootstrap: str,
    *,
    group_id: str,
    topics: list[str],
    on_assign: AssignCallback,
    on_revoke: RevokeCallback | None,
    session_timeout_ms: int,
    heartbeat_interval_ms: int,
    client_id: str,
    connect_timeout_s: float,
) -> ConfluentConsumer:
    config = _consumer_config(bootstrap, client_id, group_id)
    config.update(
        {
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": heartbeat_interval_ms,
            # Eager protocol: every rebalance revokes everything and assigns afresh, and on_assign
            # decides every start offset.
            "partition.assignment.strategy": "range,roundrobin",
        }
    )
    raw = ck.Consumer(config)
    try:
        _probe(raw, bootstrap, connect_timeout_s)
    except KafkaUnavailable:
        raw.close()
        raise
    wrapper = ConfluentConsumer(raw)

    def assigned(consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        wrapper._rebalances += 1
        ours = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        starts = dict(on_assign(ours)) if ours else {}
        wrapper._start_offsets = {}
        for tp, ours_tp in zip(partitions, ours, strict=True):
            start = starts.get(ours_tp)
            if start is None:
                tp.offset = _OFFSET_BEGINNING
            else:
                if start < 0:
                    raise ValueError(f"on_assign returned a negative offset {start} for {ours_tp}")
                tp.offset = start
                wrapper._start_offsets[(tp.topic, tp.partition)] = start
        consumer.assign(partitions)

    def revoked(consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        wrapper._rebalances += 1
        try:
            if on_revoke is not None and partitions:
                on_revoke([TopicPartition(tp.topic, tp.partition) for tp in partitions])
        finally:
            consumer.unassign()

    raw.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)
    return wrapper


def make_assigned_consumer(
    bootstrap: str, *, offsets: Mapping[TopicPartition, int], client_id: str, connect_timeout_s: float
) -> ConfluentConsumer:
    # librdkafka needs a group.id even for manual assignment; nothing is ever committed to it.
    raw = ck.Consumer(_consumer_config(bootstrap, client_id, f"{client_id}-unused"))
    try:
        _probe(raw, bootstrap, connect_timeout_s)
    except KafkaUnavailable:
        raw.close()
        raise
    raw.assign([ck.TopicPartition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()])
    return ConfluentConsumer(raw)


# --- admin --------------------------------------------------------------------------------------


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(_base_config(bootstrap, "infermeter-admin"))


def list_partitions(bootstrap: str, topic: str, *, timeout_s: float) -> list[TopicPartition]:
    admin = _admin(bootstrap)
    try:
        # Ask for every topic: naming one in a metadata request may auto-create it.
        metadata = admin.list_topics(timeout=timeout_s)
    except ck.KafkaException as exc:
        raise KafkaUnavailable(f"Kafka broker at {bootstrap} is not reachable: {exc.args[0]}") from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        return []
    return [TopicPartition(topic, p) for p in sorted(info.partitions)]


def create_topic(bootstrap: str, name: str, partitions: int, *, timeout_s: float) -> None:
    admin = _admin(bootstrap)
    _probe(admin, bootstrap, timeout_s)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=-1)],
        request_timeout=timeout_s,
        operation_timeout=timeout_s,
    )
    try:
        futures[name].result(timeout=timeout_s)
        log.info("created topic %s with %d partitions", name, partitions)
    except ck.KafkaException as exc:
        err = exc.args[0]
        if not (isinstance(err, ck.KafkaError) and err.code() == _TOPIC_ALREADY_EXISTS):
            raise KafkaError(f"could not create topic {name} on {bootstrap}: {err}") from None
    _wait_visible(admin, bootstrap, name, timeout_s)


def _wait_visible(admin: AdminClient, bootstrap: str, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=timeout_s)
        info = metadata.topics.get(name)
        if info is not None and info.error is None and info.partitions:
            return
        if time.monotonic() > deadline:
            raise KafkaError(
                f"topic {name} does not show in the metadata of {bootstrap} after {timeout_s:g} s"
            )
        time.sleep(0.05)
