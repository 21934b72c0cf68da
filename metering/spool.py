"""The producers' spool: a durable local SQLite file of encoded events, kept until it is safe to forget them.

Every producer of events (the gateway's emitter, `infermeter events ingest`, `POST /v1/events`)
appends its events here before it says they are taken; the publisher (metering/publisher.py)
publishes them and forgets them once safe, per the acknowledgement mode; the confirmer
(metering/confirmer.py) asks metering which published ones it has recorded.

Public API:

    spool = Spool(path, sync="normal")        # one SQLite file (WAL); several processes may share it
    spool = Spool(path, checkpoints="publisher")  # appends never checkpoint: the publisher thread does
    seq = spool.append(key, value, identity)  # durable (see below) when it returns: the hot path
    spool.append_many([(key, value), ...], ingest_id=None)   # one transaction; returns (first, last) seq
    spool.peek(limit) / spool.claim(limit) / spool.release(seqs) / spool.ack(seqs) / spool.depth()

    spool_dir(settings) -> Path                     # INFERMETER_SPOOL_DIR or INFERMETER_HOME/spool
    identity_of(event_dict) / event_identity(encoded) -> (source, id)   # what a confirmation names

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

import fcntl
import logging
import os
import sqlite3
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from infermeter.settings import Settings

log = logging.getLogger("metering.spool")

CHECKPOINT_EVERY_S = 1.0  # checkpoints="publisher": how often the publisher thread checkpoints
Key = tuple[str, str]  # an event's (source, id): what metering deduplicates by
# The event's (source, id), kept with the row so the confirmer never reads or decodes the value:
# NULL = not given (decoded from the value when needed); '' = the event has none (metering
# dead-letters it without a key: the broker's ack is all there is to wait for).
NO_IDENTITY = ("", "")


def spool_dir(settings: Settings) -> Path:
    return Path(settings.spool_dir) if settings.spool_dir else Path(settings.home) / "spool"


# --- an event's identity -----------------------------------------------------------------------


class _Identity(msgspec.Struct):
    source: Any = None
    id: Any = None


_identity = msgspec.json.Decoder(_Identity)


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



# --- the intake: the spool's hot path -----------------------------------------------------------


# A frame: payload bytes, crc32 of everything after these two fields, enqueued_at (unix s), then the
# lengths of the key, the source and the id (-1: None); the payload is key + source + id + value.
_FRAME_HEAD = struct.Struct("<II")
_FRAME_REST = struct.Struct("<diii")
_FRAME_SIZE = _FRAME_HEAD.size + _FRAME_REST.size
INTAKE_ROTATE_BYTES = 8 << 20  # a fully moved intake file this large is replaced by a new one


def _frame(key: bytes | None, value: bytes, identity: tuple[str, str] | None, enqueued_at: float) -> bytes:
    source, event_id = (None, None) if identity is None else identity
    source_bytes = b"" if source is None else source.encode()
    id_bytes = b"" if event_id is None else event_id.encode()
    rest = _FRAME_REST.pack(enqueued_at, -1 if key is None else len(key), -1 if source is None else len(source_bytes),
                            -1 if event_id is None else len(id_bytes))
    payload = (key or b"") + source_bytes + id_bytes + value
    return _FRAME_HEAD.pack(len(payload), zlib.crc32(payload, zlib.crc32(rest))) + rest + payload


def _frames(data: bytes, limit: int | None = None) -> tuple[list[tuple], int]:
    """The complete, intact frames at the start of `data` (at most `limit`) as spool rows (key,
    value, enqueued_at, source, event_id), and the bytes they take; stops at the first torn or
    damaged frame."""
    rows: list[tuple] = []
    position, end_of_data = 0, len(data)
    view = memoryview(data)
    while position + _FRAME_SIZE <= end_of_data and (limit is None or len(rows) < limit):
        size, crc = _FRAME_HEAD.unpack_from(data, position)
        end = position + _FRAME_SIZE + size
        if end > end_of_data or zlib.crc32(view[position + _FRAME_HEAD.size:end]) != crc:
            break
        enqueued_at, key_size, source_size, id_size = _FRAME_REST.unpack_from(data, position + _FRAME_HEAD.size)
        cursor = position + _FRAME_SIZE
        fields = []
        for field_size in (key_size, source_size, id_size):
            fields.append(None if field_size < 0 else data[cursor:cursor + field_size])
            cursor += max(field_size, 0)
        key, source, event_id = fields
        rows.append((key, data[cursor:end], enqueued_at, None if source is None else source.decode(),
                     None if event_id is None else event_id.decode()))
        position = end
    return rows, position


class Intake:
    """An append-only file in front of a spool: the producers' hot path. `append` writes the
    encoded events with one write(2) (durable when it returns, as an append to the spool is: in the
    kernel's page cache, so `kill -9` loses nothing; with sync="full" also on disk); the publisher
    thread `move`s them into the spool in one transaction per round, recording how far it got in the
    same transaction. Opening an intake moves whatever a previous process left in it (up to a torn
    last frame, a write cut by a power loss) and starts a new file. One process at a time: the
    intake holds a lock on `<spool>.intake.lock` (the kernel drops it when the process dies)."""

    def __init__(self, spool: Spool, *, sync: str = "normal", rotate_bytes: int = INTAKE_ROTATE_BYTES) -> None:
        self.spool = spool
        self._rotate_bytes = rotate_bytes
        self._flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_DSYNC if sync == "full" else 0)
        self._lock = threading.Lock()  # appends (the write and its counters) against a change of file
        self._move_lock = threading.Lock()  # one move at a time
        self._lock_file = os.open(f"{spool.path}.intake.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_file)
            raise RuntimeError(f"{spool.path}: its intake is in use by another process") from None
        self._appended = self._moved = 0  # events
        self._generation = self._recover() + 1
        spool.take_in([], self._generation, 0)  # from here on only the new file counts
        self._remove_files_before(self._generation)
        self._fd = os.open(self._file(self._generation), self._flags, 0o600)
        self._reader = os.open(self._file(self._generation), os.O_RDONLY)
        self._written = 0  # bytes of the current file written by complete appends
        self._moved_to = 0

    def _file(self, generation: int) -> str:
        return f"{self.spool.path}.intake-{generation}"

    def _generations(self) -> list[int]:
        prefix = f"{self.spool.path.name}.intake-"
        found = []
        for path in self.spool.path.parent.glob(prefix + "*"):
            suffix = path.name[len(prefix):]
            if suffix.isdigit():
                found.append(int(suffix))
        return sorted(found)

    def _remove_files_before(self, generation: int) -> None:
        for old in self._generations():
            if old < generation:
                os.unlink(self._file(old))

    def _recover(self) -> int:
        """Move what earlier processes left in their intake files; the newest generation seen."""
        generation, moved_to = self.spool.intake_position()
        newest = generation
        for found in self._generations():
            if found < generation:
                continue
            start = moved_to if found == generation else 0
            with open(self._file(found), "rb") as file:
                file.seek(start)
                data = file.read()
            rows, used = _frames(data)
            if used < len(data):
                log.warning("spool %s: %d bytes at the end of intake file %d are not a whole event (a write cut "
                            "short): dropped", self.spool.path, len(data) - used, found)
            self.spool.take_in(rows, found, start + used)
            newest = found
        return newest

    def append(self, items: Sequence[tuple]) -> None:
        """Write (key, value, identity) items with one write(2): durable when this returns."""
        now = time.time()
        data = b"".join([_frame(key, value, identity, now) for key, value, identity in items])
        with self._lock:
            written = 0
            try:
                while written < len(data):
                    written += os.write(self._fd, data[written:])
            except BaseException:
                if written:  # a partial write (disk full): cut it off, the next append starts clean
                    os.ftruncate(self._fd, self._written)
                raise
            self._written += written
            self._appended += len(items)

    def pending(self) -> int:
        """Events appended and not yet moved into the spool."""
        return self._appended - self._moved

    def oldest_enqueued_at(self) -> float | None:
        """When the oldest event not yet moved was appended (None if none, or if a move is changing
        files right now: a gauge's reading, not worth waiting for)."""
        if self.pending() <= 0:
            return None
        try:
            head = os.pread(self._reader, _FRAME_SIZE, self._moved_to)
        except OSError:
            return None
        return _FRAME_REST.unpack_from(head, _FRAME_HEAD.size)[0] if len(head) == _FRAME_SIZE else None

    def move(self) -> int:
        """Move what was appended so far into the spool (one transaction); how many events."""
        with self._move_lock:
            with self._lock:
                end = self._written
            moved = 0
            if end > self._moved_to:
                data = os.pread(self._reader, end - self._moved_to, self._moved_to)
                rows, used = _frames(data)
                self.spool.take_in(rows, self._generation, self._moved_to + used)
                self._moved_to += used
                self._moved += len(rows)
                moved = len(rows)
            if self._moved_to >= self._rotate_bytes:
                moved += self._rotate()
            return moved

    def read(self, limit: int) -> tuple[list[SpooledEvent], int]:
        """The oldest events appended and not yet moved (at most `limit`), numbered 0, 1, ... (they
        are not in the spool), and where they end in the intake file: a publisher that produces them
        straight from here, then `settle`s them."""
        with self._move_lock:
            with self._lock:
                end = self._written
            if end <= self._moved_to:
                return [], self._moved_to
            rows, used = _frames(os.pread(self._reader, end - self._moved_to, self._moved_to), limit)
            events = [SpooledEvent(n, key, value, enqueued_at, source=source, event_id=event_id)
                      for n, (key, value, enqueued_at, source, event_id) in enumerate(rows)]
            return events, self._moved_to + used

    def settle(self, events: Sequence[SpooledEvent], end: int, keep: Iterable[int]) -> None:
        """Done with `events` (a `read` ending at `end`): those numbered in `keep` go into the spool
        (their publication failed), the others are forgotten; in one transaction."""
        kept = set(keep)
        with self._move_lock:
            self.spool.take_in([(e.key, e.value, e.enqueued_at, e.source, e.event_id) for e in events if e.seq in kept],
                               self._generation, end)
            self._moved_to = end
            self._moved += len(events)
            if self._moved_to >= self._rotate_bytes:
                self._rotate()

    def _rotate(self) -> int:
        """A new file for the appends; the rest of the old one moved, then it is removed."""
        new_generation = self._generation + 1
        new_fd = os.open(self._file(new_generation), self._flags, 0o600)
        with self._lock:
            old_fd, self._fd = self._fd, new_fd
            end, self._written = self._written, 0
        rows, _used = _frames(os.pread(self._reader, end - self._moved_to, self._moved_to))
        self.spool.take_in(rows, new_generation, 0)
        os.close(old_fd)
        os.close(self._reader)
        os.unlink(self._file(self._generation))
        self._generation = new_generation
        self._reader = os.open(self._file(new_generation), os.O_RDONLY)
        self._moved_to = 0
        self._moved += len(rows)
        return len(rows)

    def close(self) -> None:
        """Move the rest into the spool and let another process have the intake."""
        self.move()
        os.close(self._fd)
        os.close(self._reader)
        os.close(self._lock_file)


def intake_depth(path: Path | str) -> int:
    """Events in the intake files of spool `path` not yet moved into it (read from the files, as the
    next process to open the intake would find them)."""
    path = Path(path)
    spool = Spool(path)
    try:
        generation, moved_to = spool.intake_position()
    finally:
        spool.close()
    count = 0
    prefix = f"{path.name}.intake-"
    for file in sorted(path.parent.glob(prefix + "*")):
        suffix = file.name[len(prefix):]
        if suffix.isdigit() and int(suffix) >= generation:
            data = file.read_bytes()[moved_to if int(suffix) == generation else 0:]
            count += len(_frames(data)[0])
    return count


__all__ = [
    "CHECKPOINT_EVERY_S", "INTAKE_ROTATE_BYTES", "NO_IDENTITY", "Intake", "Key", "Spool", "SpooledEvent",
    "event_identity", "identity_of", "intake_depth", "spool_dir",
]
