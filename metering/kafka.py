"""The Kafka client layer: one small interface, two backends.

- `confluent` (default): confluent-kafka, i.e. librdkafka. Fast (~100k+ msg/s each way here).
- `kafka-python`: the pure-Python client, for machines where librdkafka is unwanted.

Both pass one contract suite (tests/kafka/test_contract.py) against the real broker.

What the interface promises (docs/kafka.md has the long version):
- Producers: `acks=all`, idempotent by default; `produce` only queues; delivery callbacks run on
  the caller's thread inside `poll`/`flush`; `flush` returns how many messages are still not
  acknowledged (0 = every one acked).
- Consumers: never commit offsets to Kafka. Offsets live in Postgres; on every assignment the
  consumer asks `on_assign(partitions)` where to start and seeks there exactly; partitions that
  `on_assign` leaves out start at the earliest offset. `on_revoke(partitions)` runs before
  partitions go away (rebalance and close).
- Never trust end offsets (`seek_to_end`, watermarks, lag): Tansu reports them wrong. Count
  messages to decide "caught up".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from infermeter.settings import Settings

BACKENDS = ("confluent", "kafka-python")

# Group timing that works on Tansu (joins take ~3 s instead of ~23 s) and on real Kafka.
DEFAULT_SESSION_TIMEOUT_MS = 6000
DEFAULT_HEARTBEAT_INTERVAL_MS = 1000
# How long constructors wait for the broker before raising KafkaUnavailable.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# Partitions of the dead-letter topic: it carries few messages.
DEAD_LETTER_PARTITIONS = 1
# Largest message producers send (4 MiB): oversized events still reach the consumer, which
# dead-letters them with their reason instead of the producer failing.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class KafkaError(Exception):
    """Any failure of the Kafka layer (base class)."""


class KafkaUnavailable(KafkaError):
    """The broker cannot be reached; the message names the bootstrap address."""


class DeliveryFailed(KafkaError):
    """A produced message was not acknowledged by the broker (given to on_delivery)."""


class UnknownBackend(KafkaError, ValueError):
    """A backend name that is not one of BACKENDS."""


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int | None


def _message_factory() -> Callable[..., Message]:
    """Message(...) without the frozen dataclass's __init__, which sets each field through
    object.__setattr__: writing the slots directly costs ~0.5 us less per message, which matters on
    the consumer's hot path (100k+ messages/s). Same object, same equality and repr."""
    new = object.__new__
    s_topic, s_partition, s_offset, s_key, s_value, s_headers, s_timestamp = (
        Message.__dict__[name].__set__
        for name in ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms")
    )

    def make(topic, partition, offset, key, value, headers, timestamp_ms):
        m = new(Message)
        s_topic(m, topic)
        s_partition(m, partition)
        s_offset(m, offset)
        s_key(m, key)
        s_value(m, value)
        s_headers(m, headers)
        s_timestamp(m, timestamp_ms)
        return m

    return make


new_message = _message_factory()

DeliveryCallback = Callable[[Exception | None, Message | None], None]
AssignCallback = Callable[[list[TopicPartition]], Mapping[TopicPartition, int]]
RevokeCallback = Callable[[list[TopicPartition]], None]


class Producer(Protocol):
    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one message (non-blocking unless the local queue is full)."""

    def poll(self, timeout_s: float = 0) -> None:
        """Serve delivery callbacks of acknowledged (or failed) messages."""

    def flush(self, timeout_s: float = 30) -> int:
        """Wait for every queued message; return how many are still unacknowledged (0 = all acked)."""

    def close(self, timeout_s: float = 5) -> None:
        """Wait up to `timeout_s` for queued messages, then release the client."""


class Consumer(Protocol):
    def poll_batch(self, max_messages: int, timeout_s: float) -> list[Message]:
        """Up to `max_messages`, waiting at most about `timeout_s` to fill the batch."""

    def assignment(self) -> list[TopicPartition]:
        """The partitions this consumer currently owns."""

    def close(self) -> None:
        """Leave the group (on_revoke runs first) and release the client."""


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise UnknownBackend(f"unknown Kafka backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def _backend_module(backend: str):
    _check_backend(backend)
    if backend == "confluent":
        from metering.kafka_backends import confluent as module
    else:
        from metering.kafka_backends import kafka_python as module
    return module


def make_producer(
    bootstrap: str,
    backend: str = "confluent",
    *,
    idempotent: bool = True,
    linger_ms: int = 5,
    client_id: str = "infermeter",
    connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S,
) -> Producer:
    """A producer with acks=all. Raises KafkaUnavailable if the broker does not answer within
    `connect_timeout_s`; pass None to skip that check (e.g. a spool publisher that must start while
    Kafka is down: its messages then wait in the client queue until the broker is back)."""
    return _backend_module(backend).make_producer(
        bootstrap,
        idempotent=idempotent,
        linger_ms=linger_ms,
        client_id=client_id,
        connect_timeout_s=connect_timeout_s,
    )


def make_consumer(
    bootstrap: str,
    *,
    backend: str = "confluent",
    group_id: str,
    topics: list[str],
    on_assign: AssignCallback,
    on_revoke: RevokeCallback | None = None,
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
    client_id: str = "infermeter-metering",
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> Consumer:
    """A group member subscribed to `topics` that never commits to Kafka.

    `on_assign(partitions)` returns {partition: offset to start from}; others start at the earliest
    offset. on_assign runs on the caller's thread inside `poll_batch` (both backends) and may block
    without losing the membership. on_revoke runs before partitions go away, while `poll_batch` or
    `close` is in progress (on kafka-python's I/O thread with that backend: keep it quick)."""
    return _backend_module(backend).make_consumer(
        bootstrap,
        group_id=group_id,
        topics=list(topics),
        on_assign=on_assign,
        on_revoke=on_revoke,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        client_id=client_id,
        connect_timeout_s=connect_timeout_s,
    )


def make_assigned_consumer(
    bootstrap: str,
    *,
    backend: str = "confluent",
    offsets: Mapping[TopicPartition, int],
    client_id: str = "infermeter-reader",
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> Consumer:
    """A consumer outside any group, reading exactly `offsets` (manual assignment).

    For tools, benchmarks and tests (reading a dead-letter topic, counting a topic)."""
    return _backend_module(backend).make_assigned_consumer(
        bootstrap, offsets=dict(offsets), client_id=client_id, connect_timeout_s=connect_timeout_s
    )


def list_partitions(
    bootstrap: str,
    topic: str,
    *,
    backend: str = "confluent",
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> list[TopicPartition]:
    """The partitions of `topic`, sorted ([] if the topic does not exist)."""
    return _backend_module(backend).list_partitions(bootstrap, topic, timeout_s=timeout_s)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    backend: str = "confluent",
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> None:
    """Create `name` with `partitions` partitions unless it exists (idempotent, race-safe).

    Returns once the topic shows in the broker's metadata."""
    if partitions < 1:
        raise ValueError(f"a topic needs at least one partition, got {partitions}")
    _backend_module(backend).create_topic(bootstrap, name, partitions, timeout_s=timeout_s)


def ensure_topics(bootstrap: str, settings: Settings) -> None:
    """Create the events topic (settings.topic_partitions partitions, keyed by customer id) and the
    dead-letter topic if they are missing. Idempotent; safe when several processes call it at once."""
    backend = getattr(settings, "kafka_backend", "confluent")
    create_topic(bootstrap, settings.events_topic, settings.topic_partitions, backend=backend)
    create_topic(bootstrap, settings.dead_letter_topic, DEAD_LETTER_PARTITIONS, backend=backend)


__all__ = [
    "BACKENDS",
    "Consumer",
    "DeliveryFailed",
    "KafkaError",
    "KafkaUnavailable",
    "Message",
    "Producer",
    "TopicPartition",
    "UnknownBackend",
    "create_topic",
    "ensure_topics",
    "list_partitions",
    "make_assigned_consumer",
    "make_consumer",
    "make_producer",
]
