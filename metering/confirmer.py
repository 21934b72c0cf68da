"""The confirmer: which published events metering has recorded, so that the spool may forget them.

With the metered acknowledgement (ack="metered", metering/publisher.py) a spooled event is
forgotten once metering has recorded it (its (source, id) is in `event_keys`) or dead-lettered it,
not when the broker acknowledged it: the embedded Tansu broker is memory-only, so its ack promises
nothing across a crash. The publisher marks a row published (with the time) when it takes it; the
`Confirmer` (on the publisher's confirmer thread, in batches and off the producer's path) asks
metering which of the published keys it has handled, deletes those rows, and puts back to pending
the rows still unconfirmed `ack_timeout_s` after they were published (the broker lost them: publish
again; the timeout doubles on each further attempt, up to an hour, so a consumer that is merely
behind does not flood its own topic). Republishing is harmless: metering drops duplicates by
(source, id).

Public API:

    confirm = MeteringConfirmer(dsn)           # a `Confirm`: (keys, since) -> the keys metering handled
    confirmer = Confirmer(spool, confirm, stopping=event, on_released=..., ack_timeout_s=30)
    confirmer.sweep_at_start()                 # what a previous process left published
    confirmer.confirm_round(full=False)        # -> (settled, released)
    confirmer.unconfirmable_rows(rows)         # rows no confirmation can name: forget on the broker's ack
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from metering.event_identity import Key, event_identity
from metering.spool import Spool, SpooledEvent

log = logging.getLogger("metering.confirmer")

MAX_ACK_TIMEOUT_S = 3600.0
# (keys, earliest time any of them was first spooled, unix s) -> the keys metering has handled
Confirm = Callable[[Sequence[Key], float], set[Key]]


class MeteringConfirmer:
    """A `Confirm` on metering's database: `metering.event_lookups.handled_event_keys` on one connection,
    reopened after a failure. `dsn` may be a callable (re-read after a failure: the URL of a
    restarted local stack)."""

    # Dead letters are looked up by received_at (indexed) from this long before the oldest key was
    # spooled: allows for the clock of the producer's machine being behind the database's.
    CLOCK_SLACK_S = 3600.0

    def __init__(self, dsn: str | Callable[[], str | None]) -> None:
        self._dsn = dsn
        self._conn = None

    def __call__(self, keys: Sequence[Key], since: float) -> set[Key]:
        import psycopg

        from metering.event_lookups import handled_event_keys

        if self._conn is None or self._conn.closed:
            dsn = self._dsn() if callable(self._dsn) else self._dsn
            if not dsn:
                raise ConnectionError("no metering database to confirm events with")
            self._conn = psycopg.connect(dsn.replace("postgresql+psycopg://", "postgresql://", 1),
                                         autocommit=True, connect_timeout=5)
        try:
            return handled_event_keys(self._conn, keys, since=since - self.CLOCK_SLACK_S)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection is dropped anyway
                pass
            self._conn = None


class Confirmer:
    """Settles a spool's published rows with metering: deletes the confirmed ones and the ones no
    confirmation can name, releases the timed-out ones (`on_released` then tells the publisher).

    `stopping`: the owner's stop event (a round in progress ends at the next batch).
    `name`: the outbox's, for the log. Counters: confirmed, republished, unconfirmable."""

    def __init__(
        self,
        spool: Spool,
        confirm: Confirm,
        *,
        stopping: threading.Event,
        on_released: Callable[[], None],
        on_confirmed: Callable[[int], None] = lambda n: None,
        name: str = "outbox",
        ack_timeout_s: float = 30.0,
        batch: int = 5000,
        max_event_bytes: int | None = None,
    ) -> None:
        self.spool = spool
        self._confirm = confirm
        self._stopping = stopping
        self._on_released = on_released
        self._on_confirmed = on_confirmed
        self.name = name
        self.ack_timeout_s = ack_timeout_s
        self._batch = batch
        self._max_event_bytes = max_event_bytes
        self.confirmed = 0
        self.republished = 0
        self.unconfirmable = 0

    def unconfirmable_rows(self, rows: Iterable[SpooledEvent], among: set[int] | None = None) -> list[int]:
        """Rows metering would dead-letter without a key (no string source and id, or too large):
        no confirmation can name them, so the broker's ack is all there is to wait for."""
        forget = [
            row.seq for row in rows
            if (among is None or row.seq in among) and (
                (self._max_event_bytes is not None and len(row.value) > self._max_event_bytes)
                or row.identity is None
            )
        ]
        self.unconfirmable += len(forget)
        return forget

    def sweep_at_start(self) -> None:
        """Rows a previous process left published: confirm what metering has, publish the rest again
        (the broker they went to may be gone)."""
        try:
            self.confirm_round(full=True, timeout_s=0.0)
        except Exception as exc:  # noqa: BLE001 - metering unreachable: republish all of them
            log.warning("outbox %s: cannot confirm with metering at start (%s): publishing every "
                        "unconfirmed event again", self.name, exc)
            self.spool.release_all()

    def confirm_round(self, *, full: bool = False, timeout_s: float | None = None) -> tuple[int, int]:
        """One pass over the published rows, oldest first: (confirmed, released). Unless `full`, it
        stops after a batch not wholly settled: the frontier of what metering has is in it, and the
        newer rows are not worth asking about yet. `timeout_s` overrides ack_timeout_s (0: release
        every unconfirmed row)."""
        confirmed = released = 0
        after = 0
        while not self._stopping.is_set():
            rows = self.spool.published(self._batch, after)
            if not rows:
                break
            after = rows[-1][0]
            done, again = self._confirm_rows(rows, timeout_s)
            confirmed += done
            released += again
            if len(rows) < self._batch or (not full and done + again < len(rows)):
                break
        return confirmed, released

    def _confirm_rows(self, rows: list[tuple], timeout_s: float | None) -> tuple[int, int]:
        """rows: (seq, source, event_id, value bytes, enqueued_at, published_at, attempts)."""
        keyed: dict[Key, list[int]] = {}
        forget: list[int] = []
        decode = [row[0] for row in rows if row[1] is None]  # spooled without an identity: read it
        decoded = {seq: event_identity(value) for seq, value in self.spool.values(decode).items()}
        too_large = self._max_event_bytes
        for seq, source, event_id, size, _enqueued, _published, _attempts in rows:
            identity = decoded.get(seq) if source is None else ((source, event_id) if source and event_id else None)
            if identity is None or (too_large is not None and size > too_large):
                forget.append(seq)  # metering dead-letters it without a key: the broker's ack was all
            else:
                keyed.setdefault(identity, []).append(seq)
        handled: set[Key] = set()
        if keyed:
            handled = self._confirm(list(keyed), min(row[4] for row in rows))
        done = [seq for key in handled for seq in keyed.get(key, ())]
        now = time.time()
        base = self.ack_timeout_s if timeout_s is None else timeout_s
        settled = set(done)
        settled.update(forget)
        late = [
            seq for seq, _s, _e, _n, _enqueued, published_at, attempts in rows
            if seq not in settled and now - published_at >= min(base * 2 ** max(attempts - 1, 0), MAX_ACK_TIMEOUT_S)
        ]
        if forget:
            self.spool.ack(forget)
            self.unconfirmable += len(forget)
        if done:
            self.spool.ack(done)
            self.confirmed += len(done)
            self._on_confirmed(len(done))
        if late:
            self.spool.release(late)
            self.republished += len(late)
            self._on_released()
            if timeout_s != 0.0:
                log.warning("outbox %s: %d events not metered %.0f s after publication: publishing them again",
                            self.name, len(late), base)
        return len(done) + len(forget), len(late)

    def close(self) -> None:
        if isinstance(self._confirm, MeteringConfirmer):
            self._confirm.close()


__all__ = ["MAX_ACK_TIMEOUT_S", "Confirm", "Confirmer", "MeteringConfirmer"]
