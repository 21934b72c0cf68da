"""The producers' spool: a durable local SQLite file of encoded events, kept until it is safe to forget them.

Every producer of events (the gateway's emitter, `infermeter events ingest`, `POST /v1/events`)
appends its events here (the gateway's emitter through the intake file in front of it,
metering/intake.py) before it says they are taken; the publisher (metering/publisher.py)
publishes them and forgets them once safe, per the acknowledgement mode; the confirmer
(metering/confirmer.py) asks metering which published ones it has recorded.

Public API:

    spool = Spool(path, sync="normal")        # one SQLite file (WAL); several processes may share it
    spool = Spool(path, checkpoints="publisher")  # appends never checkpoint: the publisher thread does
    seq = spool.append(key, value, identity)  # durable (see below) when it returns: the hot path
    spool.append_many([(key, value), ...], ingest_id=None)   # one transaction; returns (first, last) seq
    spool.peek(limit) / spool.claim(limit) / spool.release(seqs) / spool.ack(seqs) / spool.depth()
    spool.intake_position() / spool.take_in(rows, generation, moved_to)   # the intake's moves, one transaction

    spool_dir(settings) -> Path                     # INFERMETER_SPOOL_DIR or INFERMETER_HOME/spool

Each row keeps its event's (source, id) (metering/event_identity.py: what a confirmation names).

Durability (INFERMETER_SPOOL_SYNC):
- "normal" (default): in WAL mode a commit is written to the WAL file with write(2) before `append`
  returns, fsync happens at checkpoints. `kill -9`, an OOM kill or a crash of the process lose
  nothing (the bytes are in the kernel's page cache); a power loss or kernel crash can lose the
  last commits since the previous checkpoint, never corrupt the file.
- "full": fsync the WAL on every commit: survives power loss, costs a disk flush per append.

Checkpoints (copying the WAL into the database file, with an fsync): by default SQLite runs one in
whichever commit takes the WAL past 1,000 pages, so now and then an append pays for it. With
checkpoints="publisher" (the gateway's emitter) the appending connection never checkpoints; the
publisher thread runs a passive one (`Spool.checkpoint`, its own connection: appends and reads go
on meanwhile) once every CHECKPOINT_EVERY_S (1 s), between publish rounds: the WAL holds about that
long's writes (more while a round waits on an unreachable Kafka). Durability is the same either way.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infermeter.settings import Settings
from metering.event_identity import NO_IDENTITY, event_identity

log = logging.getLogger("metering.spool")

CHECKPOINT_EVERY_S = 1.0  # checkpoints="publisher": how often the publisher thread checkpoints


def spool_dir(settings: Settings) -> Path:
    return Path(settings.spool_dir) if settings.spool_dir else Path(settings.home) / "spool"


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
# How far the intake file (`Intake`) has been moved into the table: written in the same transaction
# as the rows it moved, so a crash never moves a frame twice or skips one.
_INTAKE_SCHEMA = """
CREATE TABLE IF NOT EXISTS intake_position (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    moved_to INTEGER NOT NULL
)
"""
# Spools written before rows had a state: every row there is pending.
_ADDED_COLUMNS = {"published_at": "REAL", "attempts": "INTEGER NOT NULL DEFAULT 0", "ingest_id": "TEXT",
                  "source": "TEXT", "event_id": "TEXT"}


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
            self._conn.execute(_INTAKE_SCHEMA)
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

    def intake_position(self) -> tuple[int, int]:
        """(generation of the intake file, bytes of it moved into the table) ((0, 0) if none yet)."""
        with self._read_lock:
            row = self._reader.execute("SELECT generation, moved_to FROM intake_position").fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def take_in(self, rows: Sequence[tuple], generation: int, moved_to: int) -> None:
        """Rows moved from the intake file ((key, value, enqueued_at, source, event_id) each) and the
        position the move reached, in one transaction."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if rows:
                    self._conn.executemany(
                        "INSERT INTO spooled_events (key, value, enqueued_at, source, event_id) VALUES (?, ?, ?, ?, ?)",
                        rows,
                    )
                self._conn.execute("INSERT OR REPLACE INTO intake_position VALUES (1, ?, ?)", (generation, moved_to))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

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

    def empty(self) -> bool:
        with self._read_lock:
            return self._reader.execute("SELECT 1 FROM spooled_events LIMIT 1").fetchone() is None

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


__all__ = ["CHECKPOINT_EVERY_S", "Spool", "SpooledEvent", "spool_dir"]
