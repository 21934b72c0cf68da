"""The intake: an append-only file in front of a spool, the producers' hot path.

`Intake(spool)` takes the encoded events with one write(2) per `append` (durable when it returns, as
an append to the spool is); the publisher thread `move`s them into the SQLite spool
(metering/spool.py) in one transaction per round, with the position the move reached, or `read`s
them to publish straight from the file and `settle`s them. Each event is a frame (its length, a
crc32, its enqueued time, key, source, id and value); a torn last frame (a write cut by a power
loss) is dropped when the file is next opened. `intake_depth(path)` counts what a spool's intake
files hold that is not yet moved.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from metering.spool import Spool, SpooledEvent

log = logging.getLogger("metering.spool")  # the spool's logger: the intake is the spool's hot path


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


__all__ = ["INTAKE_ROTATE_BYTES", "Intake", "intake_depth"]
