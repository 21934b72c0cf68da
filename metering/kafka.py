"""The Kafka client layer: one small interface, two backends.

- `confluent` (default): confluent-kafka, i.e. librdkafka, the faster of the two.
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

`publish_and_wait` is the one way to produce a set of messages and wait for the broker's
acknowledgements (the HTTP API, `events ingest` and the gateway's spool publisher use it).

The types of the interface (`Message`, `TopicPartition`, the errors, `Producer`, `Consumer`) are
defined in `metering.kafka_types`, which the backends import too, and re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from metering.kafka_types import (
    AssignCallback,
    Consumer,
    DeliveryCallback,
    DeliveryFailed,
    KafkaError,
    KafkaUnavailable,
    Message,
    Producer,
    RevokeCallback,
    TopicPartition,
    UnknownBackend,
)

if TYPE_CHECKING:
    import threading

    from infermeter.settings import Settings

BACKENDS = ("confluent", "kafka-python")

# Group timing that works on Tansu (joins take ~3 s instead of ~23 s) and on real Kafka.
DEFAULT_SESSION_TIMEOUT_MS = 6000
DEFAULT_HEARTBEAT_INTERVAL_MS = 1000
# How long constructors wait for the broker before raising KafkaUnavailable.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# Partitions of the dead-letter topic: it carries few messages.
DEAD_LETTER_PARTITIONS = 1


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


# --- publish and wait -------------------------------------------------------------------------


@dataclass(slots=True)
class PublishResult:
    """What became of the messages `publish_and_wait` produced.

    Every produced message is exactly one of: acknowledged (`acked`), refused by the broker (one of
    `failures`), or still without a delivery report when the wait ended (`unacknowledged`).
    Reports that arrive after `publish_and_wait` returned do not change the result."""

    published: int = 0  # messages queued with produce (items after a produce error are not)
    acked: int = 0
    failures: list[Exception] = field(default_factory=list)  # DeliveryFailed reports, in arrival order
    unacknowledged: int = 0
    # Positions (in `items`, from 0) of the acknowledged messages, when track_acked=True.
    acked_positions: list[int] | None = None
    timed_out: bool = False  # timeout_s passed with messages still unacknowledged
    stalled: bool = False  # no delivery report for stall_timeout_s
    stopped: bool = False  # `stop` was set while messages were still unacknowledged
    produce_error: Exception | None = None  # produce raised (errors="report" only)
    wait_error: Exception | None = None  # flush/poll raised (errors="report" only)
    # The last thing that went wrong, in words, in the order it happened (None: nothing did).
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Every message produced and acknowledged."""
        return self.error is None and self.unacknowledged == 0 and not self.failures


def publish_and_wait(
    producer: Producer,
    topic: str,
    items: Iterable[tuple[bytes | None, bytes]],
    *,
    headers: dict[str, bytes] | None = None,
    timeout_s: float | None = 30.0,
    poll_every_s: float = 0.5,
    stall_timeout_s: float | None = None,
    shared_lock: threading.Lock | None = None,
    stop: threading.Event | None = None,
    stop_grace_s: float = 2.0,
    errors: Literal["raise", "report"] = "raise",
    track_acked: bool = False,
    progress_every: int = 0,
    on_progress: Callable[[int], None] | None = None,
) -> PublishResult:
    """Produce `items` ((key, value) pairs, all with `headers`) to `topic` and wait until the broker
    has acknowledged or refused each of them, or until the wait ends.

    The wait ends early when `timeout_s` has passed since the wait began (`timed_out`), when no
    delivery report arrived for `stall_timeout_s` (`stalled`: a client that will never recover), or
    when `stop` is set (`stopped`: after one last `flush(stop_grace_s)`). It serves reports with
    `flush(poll_every_s)`; with `shared_lock` (a producer shared by threads, each waiting for its
    own messages) with `poll(poll_every_s)` under that lock instead, since `flush` would wait for
    the other threads' messages too.

    errors="raise": an exception of `produce`, `flush` or `poll` propagates. errors="report": it
    ends producing (or waiting) and lands in the result (`produce_error`, `wait_error`, `error`);
    messages produced before it are still waited for (after a produce error).

    track_acked=True records the position of every acknowledged message (`acked_positions`), for a
    caller that must know which ones to forget (the spool publisher). Every `progress_every`
    messages produced (0 = never), pending reports are served (`poll(0)`) and `on_progress(count)`
    is called. Callbacks run on the caller's thread (or, with `shared_lock`, on whichever thread
    holds the lock): the counters need no lock of their own.
    """
    acked_positions: list[int] = []
    failures: list[Exception] = []
    # `produced` is written by this thread only, `reported`/`acked` by the delivery callbacks only
    # (serialized: on this thread, or under shared_lock): no counter is written from two threads.
    produced = 0
    reported = 0
    acked = 0
    last_error: str | None = None

    def settle(err: Exception | None, _message: Message | None) -> None:
        nonlocal reported, acked, last_error
        reported += 1
        if err is None:
            acked += 1
        else:
            failures.append(err)
            last_error = str(err)

    def tracked(position: int) -> DeliveryCallback:
        def on_delivery(err: Exception | None, _message: Message | None) -> None:
            nonlocal reported, last_error
            reported += 1
            if err is None:
                acked_positions.append(position)
            else:
                failures.append(err)
                last_error = str(err)

        return on_delivery

    if shared_lock is None:
        serve = producer.flush
    else:

        def serve(timeout: float) -> None:
            with shared_lock:
                producer.poll(timeout)

    result = PublishResult()
    produce = producer.produce
    try:
        if track_acked:
            for position, (key, value) in enumerate(items):
                produce(topic, value, key=key, headers=headers, on_delivery=tracked(position))
                produced += 1
        elif progress_every > 0:
            for key, value in items:
                produce(topic, value, key=key, headers=headers, on_delivery=settle)
                produced += 1
                if produced % progress_every == 0:
                    if shared_lock is None:
                        producer.poll(0)
                    else:
                        serve(0)
                    if on_progress is not None:
                        on_progress(produced)
        else:
            for key, value in items:
                produce(topic, value, key=key, headers=headers, on_delivery=settle)
                produced += 1
    except Exception as exc:
        if errors == "raise":
            raise
        result.produce_error = exc
        last_error = f"produce failed: {exc}"

    now = time.monotonic()
    deadline = None if timeout_s is None else now + timeout_s
    last_reported, last_progress = reported, now
    while produced > reported:
        now = time.monotonic()
        if reported != last_reported:
            last_reported, last_progress = reported, now
        elif stall_timeout_s is not None and now - last_progress > stall_timeout_s:
            result.stalled = True
            last_error = f"no delivery report for {stall_timeout_s:g} s ({produced - reported} events)"
            break
        try:
            serve(poll_every_s if deadline is None else max(0.0, min(poll_every_s, deadline - now)))
        except Exception as exc:
            if errors == "raise":
                raise
            result.wait_error = exc
            last_error = f"{'flush' if shared_lock is None else 'poll'} failed: {exc}"
            break
        if stop is not None and stop.is_set():
            # Closing: give in-flight messages a last chance, then leave the rest unacknowledged.
            try:
                serve(stop_grace_s)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
            result.stopped = produced > reported
            break
        if deadline is not None and produced > reported and time.monotonic() >= deadline:
            result.timed_out = True
            break

    # Snapshot (under shared_lock: no callback of ours runs meanwhile): reports served later, by
    # another thread's poll or by close, change nothing here.
    if shared_lock is not None:
        shared_lock.acquire()
    try:
        result.published = produced
        result.failures = list(failures)
        if track_acked:
            result.acked_positions = list(acked_positions)
            result.acked = len(result.acked_positions)
        else:
            result.acked = acked
        result.unacknowledged = produced - result.acked - len(result.failures)
        result.error = last_error
    finally:
        if shared_lock is not None:
            shared_lock.release()
    return result


__all__ = [
    "BACKENDS",
    "Consumer",
    "DeliveryFailed",
    "KafkaError",
    "KafkaUnavailable",
    "Message",
    "Producer",
    "PublishResult",
    "TopicPartition",
    "UnknownBackend",
    "create_topic",
    "ensure_topics",
    "list_partitions",
    "make_assigned_consumer",
    "make_consumer",
    "make_producer",
    "publish_and_wait",
]
