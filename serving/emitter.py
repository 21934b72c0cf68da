"""The event emitter: durable local spool first, then Kafka, forgotten once safe.

Public API (the gateway and the replica agent code against this):

    emitter = Emitter(spool_dir, bootstrap, settings, name="gateway-0")
    emitter.start()                 # replays whatever is spooled, then publishes in a thread
    emitter.emit(event_dict)        # CloudEvent dict (metering.contract.make_event); durable on return
    emitter.emit_many([...])        # several in one append
    emitter.emit_batched(event_dict)  # on an event loop: with the rest of this iteration's events
    emitter.flush()                 # append now what `emit_batched` has gathered
    emitter.depth() -> int          # events spooled and not yet forgotten (see `ack`)
    emitter.publish_lag_s() -> float  # age of the oldest spooled event (0.0 if none)
    emitter.wait_drained(timeout_s) -> bool
    emitter.close(timeout_s=5)      # stops the threads; unconfirmed events stay spooled
    await emitter.aclose()          # the same from async code (runs close in a thread)

Semantics:
- `emit` encodes the event (`metering.contract.encode_event`) and appends it to the spool's
  intake file (`metering.intake.Intake`: one write(2); the publisher thread moves it into the
  SQLite spool `metering.spool.Spool`) BEFORE returning. With the default
  INFERMETER_SPOOL_SYNC=normal there is no fsync: `kill -9` of the process loses nothing already
  emitted (the next start moves the intake into the spool); only a power loss / kernel crash can
  lose the last appends. Set INFERMETER_SPOOL_SYNC=full to write every append through to the disk
  (power-loss safe, a disk flush per emit). `emit` is synchronous and cheap, so calling it on the
  event loop is fine.
- `emit_batched` (the gateway's request events, emitted as or after the client gets its answer)
  gathers the event instead; the first event of a batch schedules `flush` with `loop.call_soon`, which
  appends everything gathered in ONE write right after the callbacks already due (the rest
  of that event-loop iteration), before any callback scheduled after it: before the loop serves
  anything that arrives later. A `kill -9` can fall between `emit_batched` and that append only
  inside that one iteration, as it always could between vLLM finishing and the append. Without
  a running event loop it is `emit`. `close` appends whatever is still gathered.
- A background thread (`metering.publisher.Outbox`), woken by the appends, moves the intake into
  the spool, then reads the spool oldest first in batches
  (INFERMETER_EMITTER_BATCH_MAX_EVENTS), produces each event to `settings.events_topic` with
  key = the event's `subject` (the customer id), acks=all, waits for every delivery report of
  the batch and retries the failed ones (with backoff; the producer is re-created after failures).
  Kafka down: the spool grows (metrics infermeter_emitter_spool_depth and
  infermeter_emitter_publish_lag_seconds), nothing is dropped, and the backlog drains when the
  broker is back.
- When an event is forgotten (INFERMETER_ACK): `broker` (default with a configured
  KAFKA_BOOTSTRAP, or a broker address passed by the caller): once Kafka acknowledged it.
  `metered` (default with the embedded, memory-only broker of a running `infermeter up`): once
  metering has recorded or dead-lettered it; a confirmer thread asks metering's database every
  INFERMETER_ACK_CHECK_INTERVAL_S, and events still not recorded INFERMETER_ACK_TIMEOUT_S after
  publication are published again. With the broker of a running `infermeter up`, the emitter
  follows it when a new `up` starts it on another address, and publishes again whatever the old
  one had not delivered to metering.
- At-least-once: an event published but not yet forgotten when the process dies is published
  again on restart. Metering drops duplicates by CloudEvents (source, id), so the topic may carry
  an event twice but metering counts it once.
- One spool file per emitter name: `<spool_dir>/<name>.sqlite3` (its intake beside it,
  `<name>.sqlite3.intake-<n>`). Each gateway process uses its own name (e.g. its
  INFERMETER_GATEWAY_ID) and restarts with the same name to replay; a second process opening the
  same name while the first runs fails (the intake's lock).
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
from metering.confirmer import MeteringConfirmer
from metering.event_identity import identity_of
from metering.intake import Intake
from metering.publisher import Outbox, ack_mode
from metering.spool import Spool, SpooledEvent, spool_dir
from serving import metrics

log = logging.getLogger("serving.emitter")

ProducerFactory = Callable[[], Any]


def default_spool_dir(settings: Settings) -> Path:
    return spool_dir(settings)


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
        idle_wait_s: float = 1.0,
        ack: str | None = None,
        confirm: Callable | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.name = name
        self.topic = topic or self.settings.events_topic
        self.bootstrap = bootstrap or self.settings.kafka_bootstrap
        # The broker of a running `infermeter up` (KAFKA_BOOTSTRAP unset): memory-only, and the emitter
        # follows it if a new `up` starts it elsewhere. An address of the caller's own (a test's or a
        # benchmark's broker, with no metering behind it) counts as a configured Kafka.
        from_stack = not self.settings.kafka_bootstrap and (
            self.bootstrap is None or self.bootstrap == self._stack_bootstrap()
        )
        if ack is None and not self.settings.ack:
            ack = "metered" if from_stack else "broker"
        self.ack = ack or ack_mode(self.settings)
        spool_dir = Path(spool_dir) if spool_dir else default_spool_dir(self.settings)
        # Only the publisher thread writes to the SQLite spool (the appends go to its intake), and
        # it runs the checkpoints too (metering/spool.py, "Checkpoints").
        self.spool = Spool(spool_dir / f"{name}.sqlite3", sync=self.settings.spool_sync, checkpoints="publisher")
        # The producing side appends to the spool's intake file (one write(2) per append), which the
        # publisher thread moves into the spool each round (metering/intake.py, `Intake`).
        self.intake = Intake(self.spool, sync=self.settings.spool_sync)
        self.batch_max_events = batch_max_events or self.settings.emitter_batch_max_events
        self._producer_factory = producer_factory
        self._closed = False
        # Events of `emit_batched` not yet appended (see Semantics); emit_batched may run on
        # several threads' loops, hence the lock.
        self._gathered: list[tuple[bytes | None, bytes, tuple[str, str]]] = []
        self._gather_lock = threading.Lock()
        # The gauges are read from the spool itself when /metrics is scraped: always exact.
        metrics.SPOOL_DEPTH.labels(spool=name).set_function(self._depth_for_metrics)
        metrics.PUBLISH_LAG.labels(spool=name).set_function(self._lag_for_metrics)
        self._last_depth = 0
        self._emitted = metrics.EVENTS_EMITTED.labels(spool=name)
        self._published = metrics.EVENTS_PUBLISHED.labels(spool=name)
        self._failures = metrics.PUBLISH_FAILURES.labels(spool=name)
        if self.ack == "metered" and confirm is None:
            confirm = MeteringConfirmer(self._database_url)
        self.outbox = Outbox(
            self.spool,
            topic=self.topic,
            bootstrap=self.bootstrap,
            producer_factory=self._make_producer,
            ack=self.ack,
            confirm=confirm,
            # The broker of a running `infermeter up`: follow it if a new `up` starts it elsewhere.
            locate=self._stack_bootstrap if from_stack and topic is None else None,
            ensure_topic=self._ensure_topic if self.topic == self.settings.events_topic else None,
            name=name,
            batch_max_events=self.batch_max_events,
            linger_s=self.settings.emitter_linger_ms / 1000,
            stall_timeout_s=self.settings.emitter_stall_timeout_ms / 1000,
            ack_timeout_s=self.settings.ack_timeout_s,
            confirm_every_s=self.settings.ack_check_interval_s,
            confirm_batch=self.settings.ack_check_batch,
            max_event_bytes=self.settings.max_event_bytes,
            idle_wait_s=idle_wait_s,
            intake=self.intake,
            hooks={"on_published": self._published.inc, "on_failure": self._count_failure},
        )

    @property
    def last_error(self) -> str | None:
        return self.outbox.last_error

    def _count_failure(self, _message: str, count: int) -> None:
        self._failures.inc(count)

    def _database_url(self) -> str | None:
        if self.settings.database_url:
            return self.settings.database_url
        from infermeter.stack.local import running_stack

        return (running_stack(self.settings) or {}).get("database_url")

    def _stack_bootstrap(self) -> str | None:
        from infermeter.stack.local import running_stack

        return (running_stack(self.settings) or {}).get("kafka_bootstrap")

    def _make_producer(self, bootstrap: str):
        if self._producer_factory is not None:
            return self._producer_factory()
        from metering.kafka import make_producer

        # Not idempotent: the emitter is at-least-once anyway (metering dedupes by (source, id)),
        # and an idempotent producer stays stuck on a broker that lost its producer state (a
        # memory-only Tansu restarted on the same address never acknowledges it again).
        return make_producer(
            bootstrap, self.settings.kafka_backend, client_id=f"infermeter-emitter-{self.name}",
            connect_timeout_s=None, idempotent=False,
        )

    def _ensure_topic(self, bootstrap: str) -> None:
        """Create the events topic before the first send: a producer that first sees the topic
        missing can keep stale metadata for a long while after someone else creates it."""
        from metering.kafka import ensure_topics

        ensure_topics(bootstrap, self.settings)

    # --- producing side (any thread, event loop included) ---------------------------------------

    @staticmethod
    def _encode(event: dict) -> tuple[bytes | None, bytes, tuple[str, str]]:
        from metering.contract import encode_event, event_partition_key

        return event_partition_key(event), encode_event(event), identity_of(event)

    def emit(self, event: dict) -> None:
        """Append one CloudEvent to the spool (durable when this returns) and wake the publisher."""
        self.intake.append([self._encode(event)])
        self._after_append(1)

    def emit_batched(self, event: dict) -> None:
        """Append one CloudEvent together with the others of this event-loop iteration (`flush`,
        scheduled by the first of them); without a running loop, `emit`."""
        loop = asyncio._get_running_loop()
        if loop is None:
            self.emit(event)
            return
        item = self._encode(event)
        with self._gather_lock:
            self._gathered.append(item)
            first = len(self._gathered) == 1
        if first:
            loop.call_soon(self._flush_gathered)

    def flush(self) -> int:
        """Append what `emit_batched` gathered, in one transaction; how many events."""
        with self._gather_lock:
            items, self._gathered = self._gathered, []
        if items:
            self.intake.append(items)
            self._after_append(len(items))
        return len(items)

    def _flush_gathered(self) -> None:
        try:
            self.flush()
        except Exception:  # the spool itself failed: say so loudly, as the request's `finish` did
            log.exception("could not spool the usage events of this event-loop iteration")

    def emit_many(self, events: Iterable[dict]) -> None:
        items = [self._encode(e) for e in events]
        if items:
            self.intake.append(items)
            self._after_append(len(items))

    def _after_append(self, count: int) -> None:
        self._emitted.inc(count)
        self.outbox.wake()

    def _depth_for_metrics(self) -> float:
        if not self._closed:
            self._last_depth = self.depth()
        return float(self._last_depth)

    def _lag_for_metrics(self) -> float:
        return 0.0 if self._closed else self.publish_lag_s()

    def depth(self) -> int:
        return self.outbox.depth()

    def publish_lag_s(self) -> float:
        oldest = min((at for at in (self.spool.oldest_enqueued_at(), self.intake.oldest_enqueued_at())
                      if at is not None), default=None)
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Emitter:
        self.outbox.start()
        return self

    def wait_drained(self, timeout_s: float = 30.0) -> bool:
        return self.outbox.wait_drained(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop publishing (waiting up to `timeout_s` for the current batch); spooled events stay."""
        if not self._closed:
            self._flush_gathered()
        self.outbox.close(timeout_s)
        if not self._closed:
            self.intake.close()  # what the publisher had not moved yet goes into the spool
            self._last_depth = self.spool.depth()
            self._closed = True
            self.spool.close()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        await asyncio.to_thread(self.close, timeout_s)

    def __enter__(self) -> Emitter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _publish(self, producer, batch: list[SpooledEvent]) -> tuple[list[int], int]:
        """One publish round of `batch` (tests): (acked seqs, number failed)."""
        return self.outbox.publish(producer, batch)
