"""kafka-python (pure Python) backend of metering.kafka.

kafka-python 3 runs its network I/O (and the rebalance listener) on a background thread. To keep
the interface's promises:
- delivery results are queued by that thread and handed to `on_delivery` on the caller's thread
  inside `poll`/`flush`, as librdkafka does;
- a fresh assignment is paused by the rebalance listener (I/O thread) and on_assign runs on the
  caller's thread inside the next `poll_batch` round, before fetching resumes at the offsets it
  chose; on_revoke runs on the I/O thread while the caller waits in `poll_batch`/`close`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping

import kafka
import kafka.errors as kerrors

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

log = logging.getLogger("metering.kafka.kafka_python")


def _unavailable(bootstrap: str, timeout_s: float, exc: Exception) -> KafkaUnavailable:
    return KafkaUnavailable(
        f"Kafka broker at {bootstrap} is not reachable (no answer within {timeout_s:g} s): {exc}"
    )


def _timeout_ms(timeout_s: float) -> int:
    return max(1, int(timeout_s * 1000))


# --- producer ---------------------------------------------------------------------------------


class KafkaPythonProducer:
    def __init__(
        self,
        bootstrap: str,
        *,
        idempotent: bool,
        linger_ms: int,
        client_id: str,
        connect_timeout_s: float | None,
    ):
        config = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": idempotent,
            "linger_ms": linger_ms,
            "batch_size": 256 * 1024,
            "max_request_size": MAX_MESSAGE_BYTES,
            "bootstrap_timeout_ms": _timeout_ms(connect_timeout_s if connect_timeout_s is not None else 30.0),
        }
        if not idempotent:
            # The client insists on acks=all + retries for idempotence; without it keep order anyway.
            config["max_in_flight_requests_per_connection"] = 1
        self._bootstrap = bootstrap
        try:
            self._producer = kafka.KafkaProducer(**config)
        except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
            raise _unavailable(bootstrap, connect_timeout_s or 30.0, exc) from None
        # (on_delivery, error, metadata, topic, key, value, headers) appended by the I/O thread.
        self._done: deque = deque()
        self._outstanding = 0

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        header_list = list(headers.items()) if headers else None
        try:
            future = self._producer.send(topic, value=value, key=key, headers=header_list)
        except kerrors.KafkaTimeoutError as exc:
            raise KafkaUnavailable(
                f"could not queue a message for {topic} on {self._bootstrap}: {exc}"
            ) from None
        self._outstanding += 1
        done = self._done
        future.add_callback(lambda meta: done.append((on_delivery, None, meta, topic, key, value, headers)))
        future.add_errback(lambda exc: done.append((on_delivery, exc, None, topic, key, value, headers)))

    def poll(self, timeout_s: float = 0) -> None:
        if not self._done and timeout_s > 0:
            deadline = time.monotonic() + timeout_s
            while not self._done and self._outstanding and time.monotonic() < deadline:
                time.sleep(0.001)
        self._serve()

    def _serve(self) -> None:
        done = self._done
        while done:
            on_delivery, exc, meta, topic, key, value, headers = done.popleft()
            self._outstanding -= 1
            if on_delivery is None:
                if exc is not None:
                    log.warning("delivery to %s failed: %s", topic, exc)
                continue
            if exc is not None:
                on_delivery(
                    DeliveryFailed(f"delivery to {topic} failed: {exc}"),
                    Message(topic, -1, -1, key, value, dict(headers or {}), None),
                )
            else:
                ts = meta.timestamp if meta.timestamp is not None and meta.timestamp >= 0 else None
                on_delivery(
                    None, Message(topic, meta.partition, meta.offset, key, value, dict(headers or {}), ts)
                )

    def flush(self, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        try:
            self._producer.flush(timeout=timeout_s)
        except kerrors.KafkaTimeoutError:
            pass
        # Futures complete on the I/O thread just after the batch does: give them a moment.
        while self._outstanding > len(self._done) and time.monotonic() < deadline:
            time.sleep(0.001)
        self._serve()
        return self._outstanding

    def close(self, timeout_s: float = 5) -> None:
        remaining = self.flush(timeout_s)
        if remaining:
            log.warning(
                "producer closed with %d message(s) not acknowledged by %s", remaining, self._bootstrap
            )
        try:
            self._producer.close(timeout=0.1 if remaining else timeout_s)
        except kerrors.KafkaTimeoutError:
            # kafka-python refuses to close while messages are unacknowledged (its close() flushes
            # first and raises). Give up on them as librdkafka does: stop the sender thread.
            sender = getattr(self._producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            self._producer._closed = True


def make_producer(
    bootstrap: str, *, idempotent: bool, linger_ms: int, client_id: str, connect_timeout_s: float | None
) -> KafkaPythonProducer:
    return KafkaPythonProducer(
        bootstrap,
        idempotent=idempotent,
        linger_ms=linger_ms,
        client_id=client_id,
        connect_timeout_s=connect_timeout_s,
    )


# --- consumers --------------------------------------------------------------------------------


def _consumer_config(bootstrap: str, client_id: str, connect_timeout_s: float) -> dict:
    return {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,
        "max_poll_records": 10000,
        "bootstrap_timeout_ms": _timeout_ms(connect_timeout_s),
    }


class KafkaPythonConsumer:
    def __init__(self, consumer: kafka.KafkaConsumer, on_assign: AssignCallback | None = None):
        self._consumer = consumer
        self._on_assign = on_assign
        # Partitions the group just gave us, paused until on_assign has run on the caller's thread.
        self._pending: list[kafka.TopicPartition] | None = None
        self._pending_lock = threading.Lock()
        self._closed = False

    # Called by the rebalance listener on kafka-python's I/O thread.
    def _assigned(self, partitions: list[kafka.TopicPartition]) -> None:
        self._consumer.pause(*partitions)
        with self._pending_lock:
            self._pending = partitions

    def _revoked(self) -> None:
        with self._pending_lock:
            self._pending = None

    def _start_pending(self) -> None:
        """Run on_assign for a fresh assignment (caller's thread), seek, and resume fetching."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if not pending:
            return
        consumer = self._consumer
        ours = [TopicPartition(tp.topic, tp.partition) for tp in pending]
        starts = dict(self._on_assign(ours))
        owned = consumer.assignment()
        if self._pending is not None:
            return  # another rebalance arrived while on_assign ran: that one wins
        live = [tp for tp in pending if tp in owned]
        from_beginning = []
        for tp in live:
            start = starts.get(TopicPartition(tp.topic, tp.partition))
            if start is None:
                from_beginning.append(tp)
            elif start < 0:
                raise ValueError(f"on_assign returned a negative offset {start} for {tp}")
            else:
                consumer.seek(tp, start)
        if from_beginning:
            consumer.seek_to_beginning(*from_beginning)
        consumer.resume(*live)

    def poll_batch(self, max_messages: int, timeout_s: float) -> list[Message]:
        consumer = self._consumer
        out: list[Message] = []
        append = out.append
        deadline = time.monotonic() + timeout_s
        while True:
            if self._pending is not None:
                self._start_pending()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            # Short slices while unassigned, so a new assignment starts without waiting out the batch.
            wait_ms = max(0, min(remaining_ms, 100) if not consumer.assignment() else remaining_ms)
            records = consumer.poll(timeout_ms=wait_ms, max_records=max_messages - len(out))
            for batch in records.values():
                for r in batch:
                    headers = r.headers
                    ts = r.timestamp
                    append(
                        new_message(
                            r.topic,
                            r.partition,
                            r.offset,
                            r.key,
                            r.value,
                            dict(headers) if headers else {},
                            ts if ts is not None and ts >= 0 else None,
                        )
                    )
            if len(out) >= max_messages or deadline - time.monotonic() <= 0:
                if self._pending is not None and not out:
                    self._start_pending()
                return out

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close(autocommit=False)


class _Listener(kafka.ConsumerRebalanceListener):
    """Runs on kafka-python's I/O thread, which also sends heartbeats: it must not block. A fresh
    assignment is paused here and handed to the consumer, which calls on_assign on the caller's
    thread at the start of the next poll_batch round (a slow on_assign, e.g. a Postgres retry loop,
    then never stalls heartbeats). on_revoke runs here, because it must run before the partitions
    go away; keep it quick."""

    def __init__(self, wrapper: KafkaPythonConsumer, on_revoke: RevokeCallback | None):
        self._wrapper = wrapper
        self._on_revoke = on_revoke

    def on_partitions_revoked(self, revoked) -> None:
        self._wrapper._revoked()
        if self._on_revoke is not None and revoked:
            self._on_revoke([TopicPartition(tp.topic, tp.partition) for tp in sorted(revoked)])

    def on_partitions_assigned(self, assigned) -> None:
        if assigned:
            self._wrapper._assigned(sorted(assigned))


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
) -> KafkaPythonConsumer:
    config = _consumer_config(bootstrap, client_id, connect_timeout_s)
    config.update(
        {
            "group_id": group_id,
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": heartbeat_interval_ms,
        }
    )
    try:
        raw = kafka.KafkaConsumer(**config)
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise _unavailable(bootstrap, connect_timeout_s, exc) from None
    wrapper = KafkaPythonConsumer(raw, on_assign)
    raw.subscribe(topics=topics, listener=_Listener(wrapper, on_revoke))
    return wrapper


def make_assigned_consumer(
    bootstrap: str, *, offsets: Mapping[TopicPartition, int], client_id: str, connect_timeout_s: float
) -> KafkaPythonConsumer:
    try:
        raw = kafka.KafkaConsumer(**_consumer_config(bootstrap, client_id, connect_timeout_s))
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise _unavailable(bootstrap, connect_timeout_s, exc) from None
    raw_tps = {tp: kafka.TopicPartition(tp.topic, tp.partition) for tp in offsets}
    raw.assign(list(raw_tps.values()))
    for tp, offset in offsets.items():
        raw.seek(raw_tps[tp], offset)
    return KafkaPythonConsumer(raw)


# --- admin --------------------------------------------------------------------------------------


def _admin(bootstrap: str, timeout_s: float) -> kafka.KafkaAdminClient:
    try:
        return kafka.KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="infermeter-admin",
            bootstrap_timeout_ms=_timeout_ms(timeout_s),
            request_timeout_ms=max(_timeout_ms(timeout_s), 1000),
        )
    except (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError) as exc:
        raise _unavailable(bootstrap, timeout_s, exc) from None


def _partitions_of(admin: kafka.KafkaAdminClient, topic: str) -> list[int]:
    for info in admin.describe_topics([topic]):
        if info.get("name") == topic and not info.get("error_code"):
            return sorted(p["partition_index"] for p in info.get("partitions", []))
    return []


def list_partitions(bootstrap: str, topic: str, *, timeout_s: float) -> list[TopicPartition]:
    admin = _admin(bootstrap, timeout_s)
    try:
        return [TopicPartition(topic, p) for p in _partitions_of(admin, topic)]
    finally:
        admin.close()


def create_topic(bootstrap: str, name: str, partitions: int, *, timeout_s: float) -> None:
    admin = _admin(bootstrap, timeout_s)
    try:
        try:
            admin.create_topics(
                {name: {"num_partitions": partitions, "replication_factor": -1}},
                timeout_ms=_timeout_ms(timeout_s),
            )
            log.info("created topic %s with %d partitions", name, partitions)
        except kerrors.TopicAlreadyExistsError:
            pass
        except kerrors.KafkaError as exc:
            raise KafkaError(f"could not create topic {name} on {bootstrap}: {exc}") from None
        deadline = time.monotonic() + timeout_s
        while not _partitions_of(admin, name):
            if time.monotonic() > deadline:
                raise KafkaError(
                    f"topic {name} does not show in the metadata of {bootstrap} after {timeout_s:g} s"
                )
            time.sleep(0.05)
    finally:
        admin.close()
