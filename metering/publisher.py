"""The publisher: publishes a spool's pending events to Kafka and forgets them once safe.

`Outbox` runs, per spool (metering/spool.py), a publisher thread and, with the metered
acknowledgement or a broker to follow, a confirmer thread (metering/confirmer.py). When an event
is forgotten:

- ack="broker": once the broker acknowledged it (acks=all). Durable only if the broker is (a real
  Kafka with replication >= 3 and min.insync.replicas >= 2).
- ack="metered": once metering has recorded it (its (source, id) is in `event_keys`) or
  dead-lettered it (metering/confirmer.py). The embedded Tansu broker is memory-only: it
  acknowledges events it only holds in memory, so with it the broker's ack promises nothing
  across a crash.

Public API:

    outbox = Outbox(spool, topic=..., producer_factory=..., ack="metered", confirm=MeteringConfirmer(dsn))
    outbox.start(); outbox.wake(); outbox.wait_drained(30); outbox.close()
    outbox.publish(producer, batch)                  # one round: (acked seqs, number failed)
    outbox_for(settings, name, bootstrap=..., database_url=...)   # metering's own producers' outbox

    ack_mode(settings) -> "broker" | "metered"      # INFERMETER_ACK, else by whether Kafka is configured
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from infermeter.settings import Settings
from metering.confirmer import Confirm, Confirmer, MeteringConfirmer
from metering.intake import Intake
from metering.kafka import publish_and_wait
from metering.spool import Spool, SpooledEvent, spool_dir

log = logging.getLogger("metering.publisher")

INGEST_ID_HEADER = "infermeter-ingest-id"  # the same header as metering.processor.INGEST_ID_HEADER
ACK_MODES = ("broker", "metered")


def ack_mode(settings: Settings) -> str:
    """INFERMETER_ACK if set; else `metered` with the embedded broker (KAFKA_BOOTSTRAP unset), `broker`
    with a configured Kafka (acks=all on a replicated topic is durable)."""
    mode = settings.ack or ("broker" if settings.kafka_bootstrap else "metered")
    if mode not in ACK_MODES:
        raise ValueError(f"INFERMETER_ACK must be broker or metered, not {mode!r}")
    return mode


ProducerFactory = Callable[[str], Any]  # bootstrap -> producer


class Outbox:
    """Publishes a spool's pending rows and forgets them per the ack mode.

    Threads: a publisher (claims pending rows oldest first, produces them, waits for the broker's
    delivery reports; broker ack: deletes the acknowledged rows; metered ack: leaves them published)
    and, with metered ack or a `locate`, a confirmer (every `confirm_every_s`: asks `confirm` which
    published keys metering has handled, in batches of `confirm_batch`, deletes those, releases the
    timed-out ones; with `locate`, follows the broker to a new address).

    `min_age_s` > 0: only rows spooled at least that long ago are published (a stack-side replayer
    that leaves fresh rows to the process that wrote them and is publishing them itself).
    `intake`: the spool's `Intake` (its producers append there). With broker ack and nothing waiting
    in the spool itself, a round produces the intake's events straight from it and moves into the
    spool only those it failed to publish (the acknowledged ones never touch SQLite); otherwise
    each round first moves the intake into the spool.
    `idle_wait_s`: how long the publisher sleeps with nothing to publish and no `wake` (other
    processes' appends to a shared spool are found no later than that).
    `hooks`: optional callables on_published(n), on_confirmed(n), on_failure(message, n).
    """

    def __init__(
        self,
        spool: Spool,
        *,
        topic: str,
        bootstrap: str | None,
        producer_factory: ProducerFactory,
        ack: str = "broker",
        confirm: Confirm | None = None,
        locate: Callable[[], str | None] | None = None,
        ensure_topic: Callable[[str], None] | None = None,
        name: str = "outbox",
        batch_max_events: int = 2000,
        linger_s: float = 0.0,
        stall_timeout_s: float = 20.0,
        ack_timeout_s: float = 30.0,
        confirm_every_s: float = 0.5,
        confirm_batch: int = 5000,
        max_event_bytes: int | None = None,
        min_age_s: float = 0.0,
        idle_wait_s: float = 0.05,
        intake: Intake | None = None,
        hooks: dict[str, Callable] | None = None,
    ) -> None:
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be broker or metered, not {ack!r}")
        if ack == "metered" and confirm is None:
            raise ValueError("metered acknowledgement needs a confirm function")
        self.spool = spool
        self.topic = topic
        self.bootstrap = bootstrap
        self.ack = ack
        self.name = name
        self._producer_factory = producer_factory
        self._locate = locate
        self._ensure_topic = ensure_topic
        self._topic_ready_for: str | None = None
        self.batch_max_events = batch_max_events
        self._linger_s = linger_s
        self._stall_timeout_s = stall_timeout_s
        self._confirm_every_s = confirm_every_s
        self._min_age_s = min_age_s
        self._idle_wait_s = idle_wait_s
        self._intake = intake
        hooks = hooks or {}
        self._on_published = hooks.get("on_published") or (lambda n: None)
        self._on_failure = hooks.get("on_failure")
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._round_stop = threading.Event()  # ends the publish round in hand: closing or a new broker
        self._rescan = threading.Event()  # rows went back to pending below the publisher's cursor
        self._rebind = threading.Event()  # a new broker address: drop the producer
        self._swept = threading.Event()  # the start-up sweep is done: the publisher may begin
        self._threads: list[threading.Thread] = []
        self.last_error: str | None = None
        # metered ack: settles the published rows with metering, on the confirmer thread
        self.confirmer = None if ack != "metered" else Confirmer(
            spool, confirm, stopping=self._stopping, on_released=self._republish,
            on_confirmed=hooks.get("on_confirmed") or (lambda n: None), name=name, ack_timeout_s=ack_timeout_s,
            batch=confirm_batch, max_event_bytes=max_event_bytes,
        )

    @property
    def confirmed(self) -> int:
        return 0 if self.confirmer is None else self.confirmer.confirmed

    @property
    def republished(self) -> int:
        return 0 if self.confirmer is None else self.confirmer.republished

    @property
    def unconfirmable(self) -> int:
        return 0 if self.confirmer is None else self.confirmer.unconfirmable

    def confirm_round(self, *, full: bool = False, timeout_s: float | None = None) -> tuple[int, int]:
        """One confirmer pass (`Confirmer.confirm_round`): (confirmed, released)."""
        return self.confirmer.confirm_round(full=full, timeout_s=timeout_s)

    # --- lifecycle ---

    def start(self) -> Outbox:
        if not self._threads:
            self._stopping.clear()
            self._round_stop.clear()
            if self.ack == "metered":
                self._swept.clear()
            else:
                self._swept.set()
            self._threads.append(threading.Thread(target=self._publish_loop, name=f"outbox-{self.name}", daemon=True))
            if self.ack == "metered" or self._locate is not None:
                self._threads.append(threading.Thread(target=self._confirm_loop, name=f"confirm-{self.name}",
                                                      daemon=True))
            for thread in self._threads:
                thread.start()
        return self

    def wake(self) -> None:
        self._wakeup.set()

    def depth(self) -> int:
        """Events not yet forgotten: in the spool, and in its intake."""
        return self.spool.depth() + (0 if self._intake is None else self._intake.pending())

    def wait_drained(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.depth() == 0:
                return True
            time.sleep(0.02)
        return self.depth() == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop both threads (the publisher gets up to `timeout_s` for its round); rows stay spooled."""
        self._stopping.set()
        self._round_stop.set()
        self._wakeup.set()
        self._swept.set()
        for thread in self._threads:
            thread.join(timeout_s + 5)
        self._threads = []
        if self.confirmer is not None:
            self.confirmer.close()

    # --- the publisher ---

    def _publish_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._publish_until_stopped()
            except Exception:  # noqa: BLE001 - never leave the spool without a publisher
                log.exception("outbox %s: publisher failed; starting it again", self.name)
                self._stopping.wait(1.0)

    def _publish_until_stopped(self) -> None:
        producer = None
        backoff = 0.2
        cursor = 0
        self._swept.wait()
        try:
            while not self._stopping.is_set():
                self.spool.checkpoint()  # a no-op unless the spool leaves checkpoints to its publisher
                if self._rebind.is_set():
                    # _relocate sets _round_stop before _rebind: clearing both here leaves neither behind
                    self._rebind.clear()
                    if not self._stopping.is_set():
                        self._round_stop.clear()
                    if producer is not None:
                        _close_quietly(producer, 0.5)
                        producer = None
                    cursor = 0
                if self._rescan.is_set():
                    self._rescan.clear()
                    cursor = 0
                self._wakeup.clear()  # before looking: a `wake` from here on is not lost
                direct = self._direct()
                if direct:
                    waiting = self._intake.pending()
                else:
                    self._take_in()
                    waiting = len(self._take(cursor, peek=True))
                if not waiting:
                    self._wakeup.wait(self._idle_wait_s)
                    continue
                if waiting < self.batch_max_events and self._linger_s > 0:
                    # One publish round for a burst, not one per event: far less work per event on
                    # the producer's cores. The events are already durable meanwhile.
                    self._stopping.wait(self._linger_s)
                    self._wakeup.clear()
                if producer is None:
                    try:
                        if not self.bootstrap:
                            raise ConnectionError("no Kafka bootstrap address")
                        if self._ensure_topic is not None and self._topic_ready_for != self.bootstrap:
                            self._ensure_topic(self.bootstrap)
                            self._topic_ready_for = self.bootstrap
                        producer = self._producer_factory(self.bootstrap)
                    except Exception as exc:  # noqa: BLE001 - any client failure means: retry later
                        self._note_failure(f"cannot create producer: {exc}", waiting)
                        self._take_in()  # a backlog waits in the spool, not in the intake
                        self._stopping.wait(backoff)
                        backoff = min(backoff * 2, 5.0)
                        continue
                if direct:
                    batch, end = self._intake.read(self.batch_max_events)
                    if not batch:
                        continue
                    acked, failed = self.publish(producer, batch)
                    published = set(acked)
                    self._intake.settle(batch, end, keep=[e.seq for e in batch if e.seq not in published])
                else:
                    self._take_in()
                    batch = self._take(cursor, peek=False)
                    if not batch:
                        continue
                    acked, failed = self.publish(producer, batch)
                    self._forget(batch, acked)
                if acked:
                    self._on_published(len(acked))
                if failed:
                    cursor = 0
                    if self._stopping.is_set():
                        break  # closing: the unacknowledged events stay spooled for the next start
                    if self._rebind.is_set():
                        continue
                    self._note_failure(self.last_error or "delivery failed", failed)
                    _close_quietly(producer, 0.5)  # its queue is in the spool: do not wait for it
                    producer = None
                    self._relocate()
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                else:
                    backoff = 0.2
                    if self.ack == "metered":
                        cursor = batch[-1].seq
        finally:
            if producer is not None:
                _close_quietly(producer, 2.0)

    def _forget(self, batch: list[SpooledEvent], acked: list[int]) -> None:
        """After a round from the spool: broker ack forgets the acknowledged rows; metered ack puts the
        failed ones back to pending and forgets only those no confirmation can name."""
        if self.ack == "broker":
            if acked:
                self.spool.ack(acked)
            return
        failed_seqs = set(e.seq for e in batch) - set(acked)
        if failed_seqs:
            self.spool.release(failed_seqs)
        if acked and (forget := self.confirmer.unconfirmable_rows(batch, set(acked))):
            self.spool.ack(forget)

    def _direct(self) -> bool:
        """Publish straight from the intake this round: broker ack, and nothing waiting in the spool
        itself (a backlog goes first). The rows a round fails to publish go into the spool; the
        acknowledged ones never touch it."""
        return self._intake is not None and self.ack == "broker" and self._min_age_s <= 0 and self.spool.empty()

    def _take_in(self) -> None:
        if self._intake is not None:
            self._intake.move()

    def _take(self, cursor: int, *, peek: bool) -> list[SpooledEvent]:
        before = time.time() - self._min_age_s if self._min_age_s > 0 else None
        if self.ack == "broker" and before is None:
            # One publisher per file (the emitter's): no claim needed, rows are deleted on ack.
            return self.spool.peek(1 if peek else self.batch_max_events, cursor)
        if peek:  # is there anything to take? (the claim below reads the rows)
            return [e for e in self.spool.peek(1, cursor, pending_only=True) if before is None or e.enqueued_at < before]
        return self.spool.claim(self.batch_max_events, cursor, enqueued_before=before)

    def publish(self, producer, batch: list[SpooledEvent], *, stop: threading.Event | None = None,
                track: bool = True) -> tuple[list[int], int]:
        """Produce a batch and wait for every delivery report; (acked seqs, number failed).

        The client keeps retrying while the broker is away. If no report arrives for the stall
        timeout, this client is given up on: the rest of the batch counts as failed and is re-sent
        from the spool by a fresh producer. Any client error (queue full, fatal state) counts the rest
        of the batch as failed too; so does closing (after a last 2 s for the messages in flight).
        Rows of different ingest ids go in separate rounds (the id travels as a header).
        track=False: cheaper per message, but a round with any failure counts as failed whole."""
        acked: list[int] = []
        start = 0
        while start < len(batch):
            end = start
            while end < len(batch) and batch[end].ingest_id == batch[start].ingest_id:
                end += 1
            run = batch[start:end]
            ingest_id = run[0].ingest_id
            result = publish_and_wait(
                producer,
                self.topic,
                [(item.key, item.value) for item in run],
                headers={INGEST_ID_HEADER: ingest_id.encode()} if ingest_id else None,
                timeout_s=None,
                poll_every_s=0.5,
                stall_timeout_s=self._stall_timeout_s,
                stop=stop or self._round_stop,
                stop_grace_s=2.0,
                errors="report",
                track_acked=track,
            )
            if result.error is not None:
                self.last_error = result.error
            if track:
                acked += [run[position].seq for position in result.acked_positions]
            elif result.ok:
                acked += [item.seq for item in run]
            if len(acked) < end:
                if not track and self.last_error is None:
                    self.last_error = f"{result.unacknowledged} events not acknowledged"
                break
            start = end
        return acked, len(batch) - len(acked)

    def _note_failure(self, message: str, count: int) -> None:
        self.last_error = message
        if self._on_failure is not None:
            self._on_failure(message, count)
        log.warning("outbox %s: %s (%d events stay spooled)", self.name, message, count)

    def _relocate(self) -> bool:
        """Follow the broker to a new address (`locate`); True if it moved."""
        if self._locate is None:
            return False
        try:
            found = self._locate()
        except Exception:  # noqa: BLE001 - no stack file right now: keep the address we have
            return False
        if found and found != self.bootstrap:
            log.warning("outbox %s: the broker moved from %s to %s: publishing there", self.name, self.bootstrap, found)
            self.bootstrap = found
            self._topic_ready_for = None
            if self.ack == "metered":
                # What the old broker held is gone with it (a memory-only broker) or is still on its
                # way to metering (then the confirmer finds it recorded): publish it again.
                self.spool.release_all()
                self._rescan.set()
            self._round_stop.set()  # ends a round stuck on the old address
            self._rebind.set()
            self._wakeup.set()
            return True
        return False


    def _republish(self) -> None:
        """The confirmer put rows back to pending, perhaps below the publisher's cursor."""
        self._rescan.set()
        self._wakeup.set()

    # --- the confirmer thread ---

    def _confirm_loop(self) -> None:
        if self.confirmer is not None:
            try:
                self.confirmer.sweep_at_start()
            finally:
                self._swept.set()
        while not self._stopping.wait(self._confirm_every_s):
            try:
                self._relocate()
            except Exception:  # noqa: BLE001 - e.g. the spool busy for long: try again next round
                log.exception("outbox %s: following the broker failed", self.name)
            if self.confirmer is not None:
                try:
                    self.confirmer.confirm_round()
                except Exception as exc:  # noqa: BLE001 - metering unreachable: ask again later
                    self.last_error = f"cannot confirm with metering: {exc}"
                    log.warning("outbox %s: %s", self.name, self.last_error)


def outbox_for(
    settings: Settings,
    name: str,
    *,
    bootstrap: str | None,
    database_url: str | Callable[[], str | None] | None,
    ack: str | None = None,
    min_age_s: float = 0.0,
    locate: Callable[[], str | None] | None = None,
    linger_s: float = 0.0,
) -> Outbox:
    """The outbox of spool `<spool_dir>/<name>.sqlite3` with the settings' knobs: the producers of
    metering's own side (`events ingest`, the API, `infermeter up`'s replayer) use this."""
    from metering.kafka import ensure_topics, make_producer

    mode = ack or ack_mode(settings)
    spool = Spool(spool_dir(settings) / f"{name}.sqlite3", sync=settings.spool_sync)
    return Outbox(
        spool,
        topic=settings.events_topic,
        bootstrap=bootstrap,
        producer_factory=lambda address: make_producer(
            address, settings.kafka_backend, client_id=f"infermeter-outbox-{name}", idempotent=False,
            connect_timeout_s=None,
        ),
        ack=mode,
        confirm=MeteringConfirmer(database_url) if mode == "metered" and database_url else None,
        locate=locate,
        ensure_topic=lambda address: ensure_topics(address, settings),
        name=name,
        batch_max_events=max(settings.emitter_batch_max_events, 5000),
        linger_s=linger_s,
        stall_timeout_s=settings.emitter_stall_timeout_ms / 1000,
        ack_timeout_s=settings.ack_timeout_s,
        confirm_every_s=settings.ack_check_interval_s,
        confirm_batch=settings.ack_check_batch,
        max_event_bytes=settings.max_event_bytes,
        min_age_s=min_age_s,
    )


def _close_quietly(producer, timeout_s: float) -> None:
    try:
        producer.close(timeout_s)
    except TypeError:  # a producer whose close takes no timeout
        producer.close()
    except Exception:  # noqa: BLE001 - a client in a fatal state may fail to close; it is dropped anyway
        log.debug("outbox: producer close failed", exc_info=True)


__all__ = ["ACK_MODES", "INGEST_ID_HEADER", "Outbox", "ack_mode", "outbox_for"]