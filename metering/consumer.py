"""The metering consumer: Kafka -> validate -> dedupe -> Postgres, exactly once.

A member of the consumer group `INFERMETER_CONSUMER_GROUP`: N processes share the partitions of
the events topic. Offsets live in Postgres (written with the events); on assignment the consumer
seeks to them. Postgres going away does not lose or double anything: the batch in hand is retried
until it commits, and the offset fence makes a replay harmless.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from metering.kafka import ensure_topics, make_consumer, make_producer
from metering.kafka_types import Consumer, Producer, TopicPartition
from metering.writer import BatchWriter, Prepared, WriteResult

log = logging.getLogger("infermeter.metering")

RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class ConsumerStats:
    batches: int = 0
    written: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    skipped: int = 0
    db_retries: int = 0

    def add(self, result: WriteResult) -> None:
        self.batches += 1
        self.written += result.written
        self.accepted += result.accepted
        self.duplicates += result.duplicates
        self.rejected += result.rejected
        self.skipped += result.skipped


class MeteringConsumer:
    def __init__(self, settings: Settings, database_url: str, bootstrap: str, *, backend: str | None = None,
                 clock=None, retention_clock=None, publish_dead_letters: bool = True,
                 dead_letter_producer: Callable[[], Producer] | None = None):
        """`dead_letter_producer` makes the producer that copies dead letters to their topic, once, when
        the first copy is sent (default: `make_producer` on `bootstrap` and `backend`). `clock` (default
        the real time) is the now events are judged against; `retention_clock` (default `clock`) the
        now the retention (settings.retention_months) counts its oldest month back from."""
        self.settings = settings
        self.bootstrap = bootstrap
        self.backend = backend or settings.kafka_backend
        # One writer (one Postgres connection, one thread) per share of the partitions: partition p
        # goes to writer p % N, so each partition's batches commit in order, and since events are
        # keyed by customer, writers touch disjoint rollup rows.
        self.writers = [
            BatchWriter(
                to_libpq_url(database_url),
                group_id=settings.consumer_group,
                max_bytes=settings.max_event_bytes,
                future_tolerance_s=settings.future_tolerance_s,
                clock=clock,
                retention_months=settings.retention_months,
                retention_clock=retention_clock,
            )
            for _ in range(max(1, settings.writer_connections))
        ]
        self.writer = self.writers[0]  # offsets on assignment, dead-letter copies
        self.stats = ConsumerStats()
        self._stats_lock = threading.Lock()
        self.stop_event = threading.Event()
        self.publish_dead_letters = publish_dead_letters
        self._consumer: Consumer | None = None
        self._last_error: BaseException | None = None
        self._dlq: Producer | None = None
        self._dlq_lock = threading.Lock()  # writer threads copy dead letters concurrently
        self._make_dlq = dead_letter_producer or (
            lambda: make_producer(self.bootstrap, self.backend, client_id="infermeter-dead-letter"))

    # --- assignment: seek to the offsets stored in Postgres ------------------------------------
    def _on_assign(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        for attempt in range(10_000):
            try:
                offsets = self.writer.stored_offsets(partitions)
                log.info("assigned %s, starting at %s", partitions, offsets)
                return offsets
            except psycopg.OperationalError as exc:
                self.writer.close()
                self._sleep_backoff(attempt, f"reading offsets: {exc}")
                if self.stop_event.is_set():
                    break
        return {}

    def _sleep_backoff(self, attempt: int, why: str) -> None:
        delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
        self.stats.db_retries += 1
        log.warning("postgres unavailable (%s); retrying in %.1f s", why, delay)
        self.stop_event.wait(delay)

    def start(self) -> None:
        ensure_topics(self.bootstrap, self.settings)  # metering owns its topics: created if missing
        self._consumer = make_consumer(
            self.bootstrap,
            backend=self.backend,
            group_id=self.settings.consumer_group,
            topics=[self.settings.events_topic],
            on_assign=self._on_assign,
        )

    def write_with_retry(self, messages, writer: BatchWriter | None = None) -> WriteResult | None:
        """Write a batch, waiting out Postgres outages; None if stopped meanwhile."""
        writer = writer or self.writer
        try:
            return self._retry_operational(writer, lambda: writer.write(messages))
        except psycopg.DatabaseError as exc:
            # Postgres refused the data itself (an event the contract let through but the
            # database cannot store): find it by halves, dead-letter it, write the rest.
            log.error("batch refused by Postgres (%s); isolating the event", exc)
            self._last_error = exc
            return self._isolate(writer, messages if isinstance(messages, Prepared) else writer.prepare(messages))

    def _isolate(self, writer: BatchWriter, prepared: Prepared) -> WriteResult | None:
        messages = prepared.messages
        if len(messages) == 1:
            return self._retry_operational(writer, lambda: writer.write_refused(messages[0], self._last_error))
        total = WriteResult()
        middle = len(messages) // 2
        for half in (messages[:middle], messages[middle:]):  # in order: offsets only move forward
            try:
                result = self._retry_operational(writer, lambda half=half: writer.write(half))
            except psycopg.DatabaseError as exc:
                self._last_error = exc
                result = self._isolate(writer, writer.prepare(half))
            if result is None:
                return None
            total.merge(result)
        return total

    def _retry_operational(self, writer: BatchWriter, write):
        """Run `write`, retrying with back-off while Postgres is unreachable (or a deadlock or
        serialization failure aborted the transaction); None if stopped meanwhile."""
        attempt = 0
        while True:
            try:
                return write()
            except psycopg.OperationalError as exc:
                writer.close()
                self._sleep_backoff(attempt, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                attempt += 1
                if self.stop_event.is_set():
                    return None

    def _record(self, prepared: Prepared, result: WriteResult) -> None:
        with self._stats_lock:
            self.stats.add(result)
        if result.rejected and self.publish_dead_letters:
            self._publish_dead_letters(prepared.messages)

    def _publish_dead_letters(self, messages) -> None:
        """Best effort copy to the dead-letter topic; the dead_letters table is the record."""
        try:
            with self._dlq_lock:  # one producer: a second one would replace the first and drop its queue
                if self._dlq is None:
                    self._dlq = self._make_dlq()
                dlq = self._dlq
            positions = {(m.topic, m.partition, m.offset): m for m in messages}
            with psycopg.connect(self.writer.dsn) as conn:
                rows = conn.execute(
                    'SELECT topic, partition, "offset", reason FROM dead_letters '
                    "WHERE (topic, partition, \"offset\") IN (SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))",
                    ([p[0] for p in positions], [p[1] for p in positions], [p[2] for p in positions]),
                ).fetchall()
            for topic, partition, offset, reason in rows:
                message = positions[(topic, partition, offset)]
                headers = dict(message.headers)
                headers["infermeter-dead-letter-reason"] = reason.encode()
                headers["infermeter-origin"] = f"{topic}/{partition}/{offset}".encode()
                dlq.produce(self.settings.dead_letter_topic, message.value or b"", key=message.key, headers=headers)
            dlq.poll(0)
        except Exception as exc:  # noqa: BLE001 - never let the copy stop metering
            log.warning("could not copy dead letters to %s: %s", self.settings.dead_letter_topic, exc)

    def run(self, until: Callable[[ConsumerStats], bool] | None = None, idle_timeout_s: float | None = None) -> ConsumerStats:
        """Consume until stop() is called, `until(stats)` is true, or nothing arrived for idle_timeout_s.

        Stages overlap: this thread polls Kafka and decodes the next batch while writer threads
        (INFERMETER_WRITER_CONNECTIONS, each with its own connection and share of the partitions)
        commit earlier ones; Postgres works in its own processes meanwhile. At most two decoded
        batches wait per writer, so a slow database slows the polling instead of filling memory."""
        if self._consumer is None:
            self.start()
        lanes = [(writer, queue.Queue(maxsize=2)) for writer in self.writers]
        failures: list[BaseException] = []

        def write_loop(writer: BatchWriter, pending: queue.Queue) -> None:
            try:
                while (prepared := pending.get()) is not None:
                    result = self.write_with_retry(prepared, writer)
                    if result is None:  # stopped while Postgres was away: the batch stays unwritten
                        return
                    self._record(prepared, result)
            except BaseException as exc:  # noqa: BLE001 - handed to the polling thread
                failures.append(exc)
                self.stop_event.set()

        threads = [threading.Thread(target=write_loop, args=lane, name=f"metering-writer-{i}", daemon=True)
                   for i, lane in enumerate(lanes)]
        for thread in threads:
            thread.start()

        def hand_over(pending: queue.Queue, item) -> None:
            while not self.stop_event.is_set():
                try:
                    pending.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue

        last_activity = time.monotonic()
        try:
            while not self.stop_event.is_set():
                messages = self._consumer.poll_batch(self.settings.batch_max_events,
                                                     self.settings.batch_max_wait_ms / 1000)
                if messages:
                    if len(lanes) == 1:
                        shares = [messages]
                    else:
                        shares = [[] for _ in lanes]
                        for message in messages:
                            shares[message.partition % len(lanes)].append(message)
                    for (writer, pending), share in zip(lanes, shares, strict=True):
                        if share:
                            hand_over(pending, writer.prepare(share))
                    last_activity = time.monotonic()
                if until is not None and until(self.stats):
                    break
                if idle_timeout_s is not None and time.monotonic() - last_activity > idle_timeout_s:
                    break
        finally:
            for (_writer, pending), thread in zip(lanes, threads, strict=True):
                while thread.is_alive():
                    try:
                        pending.put(None, timeout=0.2)
                        break
                    except queue.Full:
                        continue
            for thread in threads:
                thread.join()
            self.close()
        if failures:
            raise failures[0]
        return self.stats

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None
        if self._dlq is not None:
            self._dlq.flush(5)
            self._dlq.close()
            self._dlq = None
        for writer in self.writers:
            writer.close()


def run_in_thread(consumer: MeteringConsumer) -> threading.Thread:
    thread = threading.Thread(target=consumer.run, name="metering-consumer", daemon=True)
    thread.start()
    return thread
