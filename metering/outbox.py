"""The producers' outbox: a durable local spool of encoded events, a publisher, and a confirmer.

Every producer of events (the gateway's emitter, `infermeter events ingest`, `POST /v1/events`)
appends its events here before it says they are taken, and forgets an event only once it is safe:

- ack="broker": once the broker acknowledged it (acks=all). Durable only if the broker is (a real
  Kafka with replication >= 3 and min.insync.replicas >= 2).
- ack="metered": once metering has recorded it (its (source, id) is in `event_keys`) or
  dead-lettered it. The embedded Tansu broker is memory-only: it acknowledges events it only holds
  in memory, so with it the broker's ack promises nothing across a crash. The publisher marks a
  row published (with the time) when it takes it; a confirmer thread asks metering, in batches and
  off the producer's path, which of the published keys it has handled, deletes those rows, and
  puts back to pending the rows still unconfirmed `ack_timeout_s` after they were published (the
  broker lost them: publish again; the timeout doubles on each further attempt, up to an hour, so
  a consumer that is merely behind does not flood its own topic). Republishing is harmless:
  metering drops duplicates by (source, id).

Public API:

    spool = Spool(path, sync="normal")        # one SQLite file (WAL); several processes may share it
    spool = Spool(path, checkpoints="publisher")  # appends never checkpoint: the publisher thread does
    seq = spool.append(key, value)           # durable (see below) when it returns: the hot path
    spool.append_many([(key, value), ...], ingest_id=None)   # one transaction; returns (first, last) seq
    spool.peek(limit) / spool.claim(limit) / spool.release(seqs) / spool.ack(seqs) / spool.depth()

    outbox = Outbox(spool, topic=..., producer_factory=..., ack="metered", confirm=MeteringConfirmer(dsn))
    outbox.start(); outbox.wake(); outbox.wait_drained(30); outbox.close()

    ack_mode(settings) -> "broker" | "metered"      # INFERMETER_ACK, else by whether Kafka is configured
    spool_dir(settings) -> Path                     # INFERMETER_SPOOL_DIR or INFERMETER_HOME/spool

Spool durability (INFERMETER_SPOOL_SYNC):
- "normal" (default): in WAL mode a commit is written to the WAL file with write(2) before `append`
  returns, fsync happens at checkpoints. `kill -9`, an OOM kill or a crash of the process lose
  nothing (the bytes are in the kernel's page cache); a power loss or kernel crash can lose the
  last commits since the previous checkpoint, never corrupt the file. ~20-60 us per append.
- "full": fsync the WAL on every commit: survives power loss, costs a disk flush per append.

Checkpoints (copying the WAL into the database file, with an fsync): by default SQLite runs one in
whichever commit takes the WAL past 1,000 pages, so now and then an append pays for it (1-9 ms on
this project's machine, ~20 in 5,000 gateway appends at 200 req/s). With checkpoints="publisher"
(the gateway's emitter) the appending connection never checkpoints; the outbox's publisher thread
runs a passive one (`Spool.checkpoint`, its own connection: appends and reads go on meanwhile) once
every CHECKPOINT_EVERY_S (1 s), between publish rounds: the WAL holds about that long's writes (more
while a round waits on an unreachable Kafka). Durability is the same either way.

Row states: pending (published_at NULL) -> published (published_at = when a publisher took it;
awaiting the broker's ack, then metering's confirmation) -> deleted. A publisher takes rows with
one UPDATE ... RETURNING in an immediate transaction (`claim`), so several processes publishing
from one file never publish the same row twice; a publisher that dies holding rows leaves them
published, and the confirmer's timeout (or the next start) puts them back.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from infermeter.settings import Settings
from metering.kafka import publish_and_wait

log = logging.getLogger("metering.outbox")

INGEST_ID_HEADER = "infermeter-ingest-id"  # the same header as metering.processor.INGEST_ID_HEADER
ACK_MODES = ("broker", "metered")
MAX_ACK_TIMEOUT_S = 3600.0
CHECKPOINT_EVERY_S = 1.0  # checkpoints="publisher": how often the publisher thread checkpoints


def ack_mode(settings: Settings) -> str:
    """INFERMETER_ACK if set; else `metered` with the embedded broker (KAFKA_BOOTSTRAP unset), `broker`
    with a configured Kafka (acks=all on a replicated topic is durable)."""
    mode = settings.ack or ("broker" if settings.kafka_bootstrap else "metered")
    if mode not in ACK_MODES:
        raise ValueError(f"INFERMETER_ACK must be broker or metered, not {mode!r}")
    return mode


def spool_dir(settings: Settings) -> Path:
    return Path(settings.spool_dir) if settings.spool_dir else Path(settings.home) / "spool"


# --- the spool ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpooledEvent:
    seq: int
    key: bytes | None
    value: bytes
    enqueued_at: float
    published_at: float | None = None
    attempts: int = 0
    ingest_id: str | None = None
    source: str | None = None
    event_id: str | None = None

    @property
    def identity(self) -> tuple[str, str] | None:
        """(source, id), or None if the event has none a confirmation could name."""
        if self.source is None:
            return event_identity(self.value)
        return (self.source, self.event_id) if self.source and self.event_id else None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS spooled_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key BLOB,
    value BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    published_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    ingest_id TEXT,
    source TEXT,
    event_id TEXT
)
"""
_COLUMNS = "seq, key, value, enqueued_at, published_at, attempts, ingest_id, source, event_id"
# Spools written before rows had a state: every row there is pending.
_ADDED_COLUMNS = {"published_at": "REAL", "attempts": "INTEGER NOT NULL DEFAULT 0", "ingest_id": "TEXT",
                  "source": "TEXT", "event_id": "TEXT"}
# The event's (source, id), kept with the row so the confirmer never reads or decodes the value:
# NULL = not given (decoded from the value when needed); '' = the event has none (metering
# dead-letters it without a key: the broker's ack is all there is to wait for).
NO_IDENTITY = ("", "")


def _row(row: tuple) -> SpooledEvent:
    seq, key, value, enqueued_at, published_at, attempts, ingest_id, source, event_id = row
    return SpooledEvent(int(seq), key, value, float(enqueued_at),
                        None if published_at is None else float(published_at), int(attempts), ingest_id,
                        source, event_id)


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct seqs as (first, last) runs of consecutive numbers."""
    ordered = sorted({int(s) for s in seqs})
    if not ordered:
        return []
    ranges: list[tuple[int, int]] = []
    first = last = ordered[0]
    for seq in ordered[1:]:
        if seq == last + 1:
            last = seq
        else:
            ranges.append((first, last))
            first = last = seq
    ranges.append((first, last))
    return ranges


class Spool:
    def __init__(self, path: Path | str, *, sync: str = "normal", checkpoints: str = "auto") -> None:
        if sync not in ("normal", "full"):
            raise ValueError(f"spool sync must be 'normal' or 'full', not {sync!r}")
        if checkpoints not in ("auto", "publisher"):
            raise ValueError(f"spool checkpoints must be 'auto' or 'publisher', not {checkpoints!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sync = sync
        self.checkpoints = checkpoints
        self._lock = threading.Lock()  # the writer connection: appends, claims, acks
        self._conn = self._connect()
        if checkpoints == "publisher":
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._checkpointer: sqlite3.Connection | None = None  # the publisher thread's, made on first use
        self._checkpointed_at = time.monotonic()
        with self._lock:
            self._conn.execute(_SCHEMA)
            have = {row[1] for row in self._conn.execute("PRAGMA table_info(spooled_events)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in have:
                    self._conn.execute(f"ALTER TABLE spooled_events ADD COLUMN {column} {kind}")
        # Reads (peeks, depth, the confirmer's scans) use their own connection: in WAL mode they
        # never block appends, so an emit on the gateway's event loop only ever waits for a write.
        self._read_lock = threading.Lock()
        self._reader = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._sync.upper()}")
        return conn

    # --- appending (the producers' path) ---

    def append(self, key: bytes | None, value: bytes, identity: tuple[str, str] | None = None) -> int:
        """Append one event; `identity` its (source, id) (NO_IDENTITY: it has none)."""
        source, event_id = identity or (None, None)
        with self._lock:
            cursor = self._conn.execute(
                "INSERT INTO spooled_events (key, value, enqueued_at, source, event_id) VALUES (?, ?, ?, ?, ?)",
                (key, value, time.time(), source, event_id),
            )
            return int(cursor.lastrowid)

    def append_many(self, items: Iterable[tuple], *, ingest_id: str | None = None) -> tuple[int, int]:
        """Append (key, value) or (key, value, identity) items in one transaction; (first seq, last
        seq) of the rows added ((0, -1) if none)."""
        now = time.time()
        rows = [(item[0], item[1], now, ingest_id, *((item[2] or NO_IDENTITY) if len(item) > 2 else (None, None)))
                for item in items]
        if not rows:
            return 0, -1
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                before = self._conn.execute("SELECT coalesce(max(seq), 0) FROM spooled_events").fetchone()[0]
                self._conn.executemany(
                    "INSERT INTO spooled_events (key, value, enqueued_at, ingest_id, source, event_id) "
                    "VALUES (?, ?, ?, ?, ?, ?)", rows,
                )
                last = self._conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        # AUTOINCREMENT within one immediate transaction: the rows got consecutive seqs.
        first = int(last) - len(rows) + 1
        assert first > before
        return first, int(last)

    # --- reading ---

    def peek(self, limit: int, after_seq: int = 0, *, pending_only: bool = False) -> list[SpooledEvent]:
        where = "seq > ?" + (" AND published_at IS NULL" if pending_only else "")
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM spooled_events WHERE {where} ORDER BY seq LIMIT ?", (after_seq, limit)
            ).fetchall()
        return [_row(r) for r in rows]

    def published(self, limit: int, after_seq: int = 0) -> list[tuple]:
        """Rows taken by a publisher, oldest first (the confirmer's scan), without their values:
        (seq, source, event_id, value bytes, enqueued_at, published_at, attempts)."""
        with self._read_lock:
            return self._reader.execute(
                "SELECT seq, source, event_id, length(value), enqueued_at, published_at, attempts "
                "FROM spooled_events WHERE seq > ? AND published_at IS NOT NULL ORDER BY seq LIMIT ?",
                (after_seq, limit),
            ).fetchall()

    def values(self, seqs: Sequence[int]) -> dict[int, bytes]:
        with self._read_lock:
            return dict(self._reader.execute(
                f"SELECT seq, value FROM spooled_events WHERE seq IN ({','.join('?' * len(seqs))})", list(seqs)
            ).fetchall()) if seqs else {}

    def depth(self) -> int:
        with self._read_lock:
            return int(self._reader.execute("SELECT count(*) FROM spooled_events").fetchone()[0])

    def counts(self) -> tuple[int, int]:
        """(pending, published) rows."""
        with self._read_lock:
            pending, published = self._reader.execute(
                "SELECT count(*) FILTER (WHERE published_at IS NULL), count(published_at) FROM spooled_events"
            ).fetchone()
        return int(pending), int(published)

    def oldest_enqueued_at(self) -> float | None:
        with self._read_lock:
            row = self._reader.execute("SELECT enqueued_at FROM spooled_events ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else float(row[0])

    # --- state changes ---

    def claim(self, limit: int, after_seq: int = 0, *, up_to_seq: int | None = None,
              enqueued_before: float | None = None) -> list[SpooledEvent]:
        """Take up to `limit` pending rows (oldest first, seq > after_seq): they become published now.
        Atomic across processes sharing the file: no two publishers take the same row."""
        conditions = ["published_at IS NULL", "seq > ?"]
        params: list[Any] = [after_seq]
        if up_to_seq is not None:
            conditions.append("seq <= ?")
            params.append(up_to_seq)
        if enqueued_before is not None:
            conditions.append("enqueued_at < ?")
            params.append(enqueued_before)
        with self._lock:
            rows = self._conn.execute(
                "UPDATE spooled_events SET published_at = ?, attempts = attempts + 1 WHERE seq IN ("
                f"SELECT seq FROM spooled_events WHERE {' AND '.join(conditions)} ORDER BY seq LIMIT ?) "
                f"RETURNING {_COLUMNS}",
                (time.time(), *params, limit),
            ).fetchall()
        return sorted((_row(r) for r in rows), key=lambda e: e.seq)

    def claim_range(self, first: int, last: int) -> list[SpooledEvent]:
        """Take the pending rows with first <= seq <= last (a producer publishing the rows it just
        appended: cheaper than `claim` on large batches)."""
        with self._lock:
            taken = {seq for (seq,) in self._conn.execute(
                "UPDATE spooled_events SET published_at = ?, attempts = attempts + 1 "
                "WHERE seq BETWEEN ? AND ? AND published_at IS NULL RETURNING seq", (time.time(), first, last),
            )}
        if not taken:
            return []
        with self._read_lock:
            rows = self._reader.execute(
                f"SELECT {_COLUMNS} FROM spooled_events WHERE seq BETWEEN ? AND ? ORDER BY seq", (first, last)
            ).fetchall()
        return [_row(r) for r in rows if r[0] in taken]

    def release(self, seqs: Iterable[int]) -> int:
        """Published rows back to pending (their publish failed, or the broker lost them)."""
        ranges = _ranges(seqs)
        self._write_many("UPDATE spooled_events SET published_at = NULL WHERE seq BETWEEN ? AND ?", ranges)
        return sum(b - a + 1 for a, b in ranges)

    def release_all(self) -> int:
        """Every published row back to pending (a new broker: whatever the old one held is gone)."""
        with self._lock:
            return self._conn.execute(
                "UPDATE spooled_events SET published_at = NULL WHERE published_at IS NOT NULL"
            ).rowcount

    def ack(self, seqs: Iterable[int]) -> int:
        """Forget these rows (contiguous runs of seqs are deleted as ranges)."""
        ranges = _ranges(seqs)
        self._write_many("DELETE FROM spooled_events WHERE seq BETWEEN ? AND ?", ranges)
        return sum(b - a + 1 for a, b in ranges)

    def _write_many(self, sql: str, rows: list[tuple]) -> None:
        """`sql` for every row in one immediate transaction (the writer connection, under its lock)."""
        if not rows:
            return
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(sql, rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def checkpoint(self, *, every_s: float = CHECKPOINT_EVERY_S) -> bool:
        """checkpoints="publisher": a passive checkpoint if `every_s` passed since the last one (the
        publisher thread calls this each round); whether it ran. Never blocks appends or reads."""
        if self.checkpoints != "publisher" or time.monotonic() - self._checkpointed_at < every_s:
            return False
        if self._checkpointer is None:
            self._checkpointer = self._connect()
        try:
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.OperationalError:  # busy (another process checkpoints): the next round
            log.debug("spool %s: checkpoint skipped", self.path, exc_info=True)
        self._checkpointed_at = time.monotonic()
        return True

    def close(self) -> None:
        with self._read_lock:
            self._reader.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError:  # another process holds the file: it checkpoints later
                pass
            finally:
                self._conn.close()


# --- asking metering ----------------------------------------------------------------------------


class _Identity(msgspec.Struct):
    source: Any = None
    id: Any = None


_identity = msgspec.json.Decoder(_Identity)
Key = tuple[str, str]
# (keys, earliest time any of them was first spooled, unix s) -> the keys metering has handled
Confirm = Callable[[Sequence[Key], float], set[Key]]


def event_identity(value: bytes) -> Key | None:
    """(source, id) of an encoded event, or None if it has none a confirmation could name (metering
    dead-letters such an event without a key; the broker's ack is all there is to wait for)."""
    try:
        found = _identity.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(found.source, str) and isinstance(found.id, str) and found.source and found.id:
        return found.source, found.id
    return None


def identity_of(event: Any) -> Key:
    """(source, id) of a decoded event (a dict), NO_IDENTITY if it has none."""
    if isinstance(event, dict):
        source, event_id = event.get("source"), event.get("id")
        if isinstance(source, str) and isinstance(event_id, str) and source and event_id:
            return source, event_id
    return NO_IDENTITY


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


# --- publishing and confirming -----------------------------------------------------------------


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
        self._confirm = confirm
        self._locate = locate
        self._ensure_topic = ensure_topic
        self._topic_ready_for: str | None = None
        self.batch_max_events = batch_max_events
        self._linger_s = linger_s
        self._stall_timeout_s = stall_timeout_s
        self.ack_timeout_s = ack_timeout_s
        self._confirm_every_s = confirm_every_s
        self._confirm_batch = confirm_batch
        self._max_event_bytes = max_event_bytes
        self._min_age_s = min_age_s
        self._idle_wait_s = idle_wait_s
        hooks = hooks or {}
        self._on_published = hooks.get("on_published") or (lambda n: None)
        self._on_confirmed = hooks.get("on_confirmed") or (lambda n: None)
        self._on_failure = hooks.get("on_failure")
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._round_stop = threading.Event()  # ends the publish round in hand: closing or a new broker
        self._rescan = threading.Event()  # rows went back to pending below the publisher's cursor
        self._rebind = threading.Event()  # a new broker address: drop the producer
        self._swept = threading.Event()  # the start-up sweep is done: the publisher may begin
        self._threads: list[threading.Thread] = []
        self.last_error: str | None = None
        self.confirmed = 0
        self.republished = 0
        self.unconfirmable = 0

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

    def wait_drained(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.spool.depth() == 0:
                return True
            time.sleep(0.02)
        return self.spool.depth() == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop both threads (the publisher gets up to `timeout_s` for its round); rows stay spooled."""
        self._stopping.set()
        self._round_stop.set()
        self._wakeup.set()
        self._swept.set()
        for thread in self._threads:
            thread.join(timeout_s + 5)
        self._threads = []
        if isinstance(self._confirm, MeteringConfirmer):
            self._confirm.close()

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
                batch = self._take(cursor, peek=True)
                if not batch:
                    self._wakeup.wait(self._idle_wait_s)
                    self._wakeup.clear()
                    continue
                if len(batch) < self.batch_max_events and self._linger_s > 0:
                    # One publish round for a burst, not one per event: far less work per event on
                    # the producer's cores. The events are already durable in the spool meanwhile.
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
                        self._note_failure(f"cannot create producer: {exc}", len(batch))
                        self._stopping.wait(backoff)
                        backoff = min(backoff * 2, 5.0)
                        continue
                batch = self._take(cursor, peek=False)
                if not batch:
                    continue
                acked, failed = self.publish(producer, batch)
                if self.ack == "broker":
                    if acked:
                        self.spool.ack(acked)
                else:
                    failed_seqs = set(e.seq for e in batch) - set(acked)
                    if failed_seqs:
                        self.spool.release(failed_seqs)
                    if acked and (forget := self._unconfirmable(batch, set(acked))):
                        self.spool.ack(forget)
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

    def _take(self, cursor: int, *, peek: bool) -> list[SpooledEvent]:
        before = time.time() - self._min_age_s if self._min_age_s > 0 else None
        if self.ack == "broker" and before is None:
            # One publisher per file (the emitter's): no claim needed, rows are deleted on ack.
            return self.spool.peek(self.batch_max_events, cursor)
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

    def _unconfirmable(self, rows: Iterable[SpooledEvent], among: set[int] | None = None) -> list[int]:
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

    # --- the confirmer ---

    def _confirm_loop(self) -> None:
        if self.ack == "metered":
            self._startup_sweep()
        while not self._stopping.wait(self._confirm_every_s):
            try:
                self._relocate()
            except Exception:  # noqa: BLE001 - e.g. the spool busy for long: try again next round
                log.exception("outbox %s: following the broker failed", self.name)
            if self.ack == "metered":
                try:
                    self.confirm_round()
                except Exception as exc:  # noqa: BLE001 - metering unreachable: ask again later
                    self.last_error = f"cannot confirm with metering: {exc}"
                    log.warning("outbox %s: %s", self.name, self.last_error)

    def _startup_sweep(self) -> None:
        """Rows a previous process left published: confirm what metering has, publish the rest again
        (the broker they went to may be gone). Then the publisher may begin."""
        try:
            self.confirm_round(full=True, timeout_s=0.0)
        except Exception as exc:  # noqa: BLE001 - metering unreachable: republish all of them
            log.warning("outbox %s: cannot confirm with metering at start (%s): publishing every "
                        "unconfirmed event again", self.name, exc)
            self.spool.release_all()
        finally:
            self._swept.set()

    def confirm_round(self, *, full: bool = False, timeout_s: float | None = None) -> tuple[int, int]:
        """One pass over the published rows, oldest first: (confirmed, released). Unless `full`, it
        stops after a batch not wholly settled: the frontier of what metering has is in it, and the
        newer rows are not worth asking about yet. `timeout_s` overrides ack_timeout_s (0: release
        every unconfirmed row)."""
        confirmed = released = 0
        after = 0
        while not self._stopping.is_set():
            rows = self.spool.published(self._confirm_batch, after)
            if not rows:
                break
            after = rows[-1][0]
            done, again = self._confirm_rows(rows, timeout_s)
            confirmed += done
            released += again
            if len(rows) < self._confirm_batch or (not full and done + again < len(rows)):
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
            self._rescan.set()
            self._wakeup.set()
            if timeout_s != 0.0:
                log.warning("outbox %s: %d events not metered %.0f s after publication: publishing them again",
                            self.name, len(late), base)
        return len(done) + len(forget), len(late)


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


__all__ = [
    "ACK_MODES", "NO_IDENTITY", "Confirm", "INGEST_ID_HEADER", "MeteringConfirmer", "Outbox", "Spool", "SpooledEvent",
    "ack_mode", "event_identity", "identity_of", "outbox_for", "spool_dir",
]
