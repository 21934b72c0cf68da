"""The event emitter: durable local spool first, then Kafka, retried until acknowledged.

Public API (the gateway and the replica agent code against this):

    emitter = Emitter(spool_dir, bootstrap, settings, name="gateway-0")
    emitter.start()                 # replays whatever is spooled, then publishes in a thread
    emitter.emit(event_dict)        # CloudEvent dict (metering.contract.make_event); durable on return
    emitter.emit_many([...])        # several in one spool transaction
    emitter.depth() -> int          # events spooled, not yet acknowledged by Kafka
    emitter.publish_lag_s() -> float  # age of the oldest unacknowledged event (0.0 if none)
    emitter.wait_drained(timeout_s) -> bool
    emitter.close(timeout_s=5)      # stops the publisher; unpublished events stay spooled
    await emitter.aclose()          # the same from async code (runs close in a thread)

Semantics:
- `emit` encodes the event (`metering.contract.encode_event`) and appends it to the spool
  (`serving.spool.Spool`, SQLite WAL) BEFORE returning. With the default
  INFERMETER_SPOOL_SYNC=normal the append is a write(2) into the WAL, no fsync: `kill -9` of
  the process loses nothing already emitted; only a power loss / kernel crash can lose the
  last appends since the previous checkpoint. Set INFERMETER_SPOOL_SYNC=full to fsync every
  append (power-loss safe, ~ a disk flush per emit). `emit` is synchronous and takes tens of
  microseconds with `normal`, so calling it on the event loop is fine.
- A background thread reads the spool oldest first in batches
  (INFERMETER_EMITTER_BATCH_MAX_EVENTS), produces each event to `settings.events_topic` with
  key = the event's `subject` (the customer id), acks=all, through
  `metering.kafka.make_producer`, waits for every delivery report of the batch
  (`metering.kafka.publish_and_wait`), deletes the acknowledged events from the spool, and
  retries the failed ones (with backoff; the producer is re-created after failures). Kafka down: the spool grows (metrics
  infermeter_emitter_spool_depth and infermeter_emitter_publish_lag_seconds), nothing is
  dropped, and the backlog drains when the broker is back.
- At-least-once: an event acknowledged by Kafka but killed before its spool row was deleted is
  published again on restart. Metering drops duplicates by CloudEvents (source, id), so the
  topic may carry an event twice but metering counts it once.
- One spool file per emitter name: `<spool_dir>/<name>.sqlite3`. Each gateway process uses its
  own name (e.g. its INFERMETER_GATEWAY_ID) and restarts with the same name to replay.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from infermeter.settings import Settings, get_settings
from metering.kafka import publish_and_wait
from serving import metrics
from serving.spool import Spool, SpooledEvent

log = logging.getLogger("serving.emitter")

ProducerFactory = Callable[[], Any]


def default_spool_dir(settings: Settings) -> Path:
    return Path(settings.spool_dir) if settings.spool_dir else Path(settings.home) / "spool"


class Emitter:
    def __init__(
        self,
        spool_dir: Path | str | None,
        bootstrap: str | None,
        settings: Settings | None = None,
        *,
        name: str = "gateway",
        topic: str | None = None,
        producer_factory: ProducerFactory | None = None,
        batch_max_events: int | None = None,
        idle_wait_s: float = 0.05,
    ) -> None:
        self.settings = settings or get_settings()
        self.name = name
        self.topic = topic or self.settings.events_topic
        self.bootstrap = bootstrap or self.settings.kafka_bootstrap
        self._topic_ready = False
        self._linger_s = self.settings.emitter_linger_ms / 1000
        spool_dir = Path(spool_dir) if spool_dir else default_spool_dir(self.settings)
        self.spool = Spool(spool_dir / f"{name}.sqlite3", sync=self.settings.spool_sync)
        self.batch_max_events = batch_max_events or self.settings.emitter_batch_max_events
        self._producer_factory = producer_factory or self._default_producer
        self._idle_wait_s = idle_wait_s
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The gauges are read from the spool itself when /metrics is scraped: always exact.
        metrics.SPOOL_DEPTH.labels(spool=name).set_function(self._depth_for_metrics)
        metrics.PUBLISH_LAG.labels(spool=name).set_function(self._lag_for_metrics)
        self._last_depth = 0
        self._emitted = metrics.EVENTS_EMITTED.labels(spool=name)
        self._published = metrics.EVENTS_PUBLISHED.labels(spool=name)
        self._failures = metrics.PUBLISH_FAILURES.labels(spool=name)
        self.last_error: str | None = None

    def _default_producer(self):
        from metering.kafka import make_producer

        if not self.bootstrap:
            raise ValueError("the emitter needs a Kafka bootstrap address (KAFKA_BOOTSTRAP)")
        # Not idempotent: the emitter is at-least-once anyway (metering dedupes by (source, id)),
        # and an idempotent producer stays stuck on a broker that lost its producer state (a
        # memory-only Tansu restarted on the same address never acknowledges it again).
        return make_producer(
            self.bootstrap, self.settings.kafka_backend, client_id=f"infermeter-emitter-{self.name}",
            connect_timeout_s=None, idempotent=False,
        )

    # --- producing side (any thread, event loop included) ---------------------------------------

    @staticmethod
    def _encode(event: dict) -> tuple[bytes | None, bytes]:
        from metering.contract import encode_event, event_partition_key

        return event_partition_key(event), encode_event(event)

    def emit(self, event: dict) -> None:
        """Append one CloudEvent to the spool (durable when this returns) and wake the publisher."""
        key, value = self._encode(event)
        self.spool.append(key, value)
        self._after_append(1)

    def emit_many(self, events: Iterable[dict]) -> None:
        items = [self._encode(e) for e in events]
        if items:
            self.spool.append_many(items)
            self._after_append(len(items))

    def _after_append(self, count: int) -> None:
        self._emitted.inc(count)
        self._wakeup.set()

    def _depth_for_metrics(self) -> float:
        if not self._closed:
            self._last_depth = self.spool.depth()
        return float(self._last_depth)

    def _lag_for_metrics(self) -> float:
        return 0.0 if self._closed else self.publish_lag_s()

    def depth(self) -> int:
        return self.spool.depth()

    def publish_lag_s(self) -> float:
        oldest = self.spool.oldest_enqueued_at()
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Emitter:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=f"emitter-{self.name}", daemon=True)
            self._thread.start()
        return self

    def wait_drained(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.spool.depth() == 0:
                return True
            time.sleep(0.02)
        return self.spool.depth() == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop publishing (waiting up to `timeout_s` for the current batch); spooled events stay."""
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout_s + 5)
            self._thread = None
        if not self._closed:
            self._last_depth = self.spool.depth()
            self._closed = True
            self.spool.close()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        await asyncio.to_thread(self.close, timeout_s)

    def __enter__(self) -> Emitter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the publisher thread -------------------------------------------------------------------

    def _run(self) -> None:
        producer = None
        backoff = 0.2
        try:
            while not self._stopping.is_set():
                batch = self.spool.peek(self.batch_max_events)
                if not batch:
                    self._wakeup.wait(self._idle_wait_s)
                    self._wakeup.clear()
                    continue
                if len(batch) < self.batch_max_events and self._linger_s > 0:
                    # One publish round for a burst, not one per event: far less work per event on
                    # the gateway's cores. The events are already durable in the spool meanwhile.
                    self._stopping.wait(self._linger_s)
                    self._wakeup.clear()
                    batch = self.spool.peek(self.batch_max_events)
                if producer is None:
                    try:
                        self._ensure_topic()
                        producer = self._producer_factory()
                    except Exception as exc:  # noqa: BLE001 - any client failure means: retry later
                        self._note_failure(f"cannot create producer: {exc}", len(batch))
                        self._stopping.wait(backoff)
                        backoff = min(backoff * 2, 5.0)
                        continue
                acked, failed = self._publish(producer, batch)
                if acked:
                    self.spool.ack(acked)
                    self._published.inc(len(acked))
                if failed and self._stopping.is_set():
                    break  # closing: the unacknowledged events stay spooled for the next start
                if failed:
                    self._note_failure(self.last_error or "delivery failed", failed)
                    _close_quietly(producer, 0.5)  # its queue is in the spool: do not wait for it
                    producer = None
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                else:
                    backoff = 0.2
        finally:
            if producer is not None:
                _close_quietly(producer, 2.0)

    def _ensure_topic(self) -> None:
        """Create the events topic before the first send: a producer that first sees the topic
        missing can keep stale metadata for a long while after someone else creates it."""
        if self._topic_ready or self.topic != self.settings.events_topic or not self.bootstrap:
            return
        from metering.kafka import ensure_topics

        ensure_topics(self.bootstrap, self.settings)
        self._topic_ready = True

    def _note_failure(self, message: str, count: int) -> None:
        self.last_error = message
        self._failures.inc(count)
        log.warning("emitter %s: %s (%d events stay spooled)", self.name, message, count)

    def _publish(self, producer, batch: list[SpooledEvent]) -> tuple[list[int], int]:
        """Produce a batch and wait for every delivery report; (acked seqs, number failed).

        The client keeps retrying while the broker is away. If no report arrives for
        INFERMETER_EMITTER_STALL_TIMEOUT_MS, this client is given up on: the rest of the batch counts
        as failed and is re-sent from the spool by a fresh producer. Any client error (queue full,
        fatal state) counts the rest of the batch as failed too; so does closing (after a last
        2 s for the messages in flight)."""
        result = publish_and_wait(
            producer,
            self.topic,
            [(item.key, item.value) for item in batch],
            timeout_s=None,
            poll_every_s=0.5,
            stall_timeout_s=self.settings.emitter_stall_timeout_ms / 1000,
            stop=self._stopping,
            stop_grace_s=2.0,
            errors="report",
            track_acked=True,
        )
        if result.error is not None:
            self.last_error = result.error
        acked = [batch[position].seq for position in result.acked_positions]
        return acked, len(batch) - len(acked)


def _close_quietly(producer, timeout_s: float) -> None:
    try:
        producer.close(timeout_s)
    except TypeError:  # a producer whose close takes no timeout
        producer.close()
    except Exception:  # noqa: BLE001 - a client in a fatal state may fail to close; it is dropped anyway
        log.debug("emitter: producer close failed", exc_info=True)
