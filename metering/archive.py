"""Bounded storage: a month that left the retention goes to Parquet, is verified, then its partitions go.

`infermeter metering archive --before YYYY-MM` and `infermeter up` (at start and every
INFERMETER_ARCHIVE_INTERVAL_H, `RetentionJob`) call `archive_before`. For each month before the
given one that still has a raw_events or event_keys partition, in month order:

1. its raw events are written to DIR/raw_events_YYYY_MM.parquet: to a temporary name in the same
   folder, fsynced, renamed over the final name, the folder fsynced;
2. the file is read back: its row count and key checksum (`key_checksum`, over every (source, id));
3. one transaction: the month's two partitions are locked against writes (SHARE), their row count
   and key checksum must equal the file's; then the partition lock the writer takes to create
   partitions (`metering.writer.PARTITIONS_LOCK`), the month recorded in `archived_months` (the
   writer never creates its partitions again), both partitions dropped, commit.

A crash anywhere leaves either the month's partitions (and perhaps a file, which the next run
writes again and verifies) or the dropped month with its verified file; a second run finds nothing
to do. A month inside the retention is refused (`RetentionError`): archiving it would drop the keys
that still catch its duplicates. Rollups, ledgers, invoices and billing history are never touched.

The file holds the events as stored (`payload`, the CloudEvent as JSON) with their envelope columns;
`infermeter events ingest FILE.parquet` publishes the payloads again (`archived_lines`), so a replay
into an empty database gives the same rollups (docs/metering.md, "Retention and archives").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql

from infermeter.periodic import Periodic
from infermeter.settings import Settings
from infermeter.times import add_months, month_start
from metering.processor import oldest_retained_month
from metering.writer import PARTITIONS_LOCK

log = logging.getLogger("infermeter.metering.archive")

COLUMNS = ("occurred_at", "source", "event_id", "type", "customer_id", "received_at", "payload")
BATCH_ROWS = 50_000  # rows per Parquet row group and per fetch
LOCK_TIMEOUT = "10s"  # the DROP waits for the writers' statements on raw_events; never queue them longer
_MASK = (1 << 64) - 1

# Every partition of raw_events and event_keys with the UTC month of its lower bound.
PARTITIONS_SQL = r"""
SELECT p.relname, c.relname,
       date_trunc('month', (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]
                           ::timestamptz, 'UTC')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
WHERE i.inhparent IN ('raw_events'::regclass, 'event_keys'::regclass)
"""
# The same checksum as `KeyChecksum` computes in Python: sum of the first 64 bits (signed) of
# md5(source || x'1f' || event_id), reduced mod 2^64 by the caller.
CHECKSUM_SQL = "SELECT count(*), coalesce(sum(('x' || left(md5(source || E'\\x1f' || event_id), 16))::bit(64)::bigint), 0) FROM {}"
RECORD_SQL = """
INSERT INTO archived_months AS a (month, file, events, key_checksum) VALUES (%s, %s, %s, %s)
ON CONFLICT (month) DO UPDATE SET file = EXCLUDED.file, events = EXCLUDED.events,
    key_checksum = EXCLUDED.key_checksum, archived_at = now()
"""


class RetentionError(ValueError):
    """A request to archive a month still inside the retention (one line, for the CLI)."""


class ArchiveError(RuntimeError):
    """A month could not be archived (file and partition disagree, a lock not granted, ...)."""


class Interrupted(Exception):
    """Stopped between two batches (`should_stop`); the partitions are untouched."""


@dataclass(frozen=True)
class ArchivedMonth:
    month: datetime
    file: Path
    events: int
    key_checksum: str  # 16 hex digits

    def to_json(self) -> dict:
        return {"month": f"{self.month:%Y-%m}", "file": str(self.file), "events": self.events,
                "key_checksum": self.key_checksum}


class KeyChecksum:
    """Order-free checksum of a set of (source, id): the sum mod 2^64 of the first 64 bits of
    md5(source + '\\x1f' + id) (CHECKSUM_SQL computes the same in Postgres)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, source: str, event_id: str) -> None:
        digest = hashlib.md5(f"{source}\x1f{event_id}".encode(), usedforsecurity=False).digest()
        self.total += int.from_bytes(digest[:8], "big", signed=True)
        self.count += 1

    @property
    def hex(self) -> str:
        return f"{self.total & _MASK:016x}"


def archive_dir(settings: Settings) -> Path:
    """INFERMETER_ARCHIVE_DIR, else INFERMETER_HOME/archive."""
    return Path(settings.archive_dir) if settings.archive_dir else Path(settings.home) / "archive"


def archive_file(directory: Path, month: datetime) -> Path:
    return directory / f"raw_events_{month:%Y_%m}.parquet"


def parse_month(text: str, name: str = "--before") -> datetime:
    """YYYY-MM -> the first instant of that UTC month."""
    match = re.fullmatch(r"(\d{4})-(\d{2})", text.strip())
    if not match or not 1 <= int(match[2]) <= 12:
        raise RetentionError(f"{name}: {text!r} is not a month (YYYY-MM, e.g. 2025-10)")
    return datetime(int(match[1]), int(match[2]), 1, tzinfo=UTC)


def check_outside_retention(before: datetime, *, now: datetime, retention_months: int) -> None:
    """Refuse (RetentionError) to archive months before `before` if any of them is retained."""
    oldest = oldest_retained_month(now, retention_months)
    if before > oldest:
        raise RetentionError(
            f"refusing to archive up to {add_months(before, -1):%Y-%m}: INFERMETER_RETENTION_MONTHS={retention_months} keeps "
            f"{oldest:%Y-%m} to {month_start(now):%Y-%m} (by this clock), and an archived month inside the "
            f"retention would let duplicates of its events in again; the latest --before allowed is {oldest:%Y-%m}"
        )


def partitions_by_month(conn: psycopg.Connection) -> dict[datetime, dict[str, str]]:
    """{month: {'raw_events': partition name, 'event_keys': partition name}} of every partition."""
    out: dict[datetime, dict[str, str]] = {}
    for parent, name, month in conn.execute(PARTITIONS_SQL):
        out.setdefault(month.astimezone(UTC), {})[parent] = name
    return out


def archive_before(
    dsn: str,
    before: datetime,
    *,
    directory: Path,
    now: datetime,
    retention_months: int,
    on_progress: Callable[[datetime, int, int | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[ArchivedMonth]:
    """Archive, verify and drop every month before `before` that still has partitions (see the
    module's docstring). `now` is the caller's clock: months inside the retention are refused
    before anything is read. on_progress(month, events written, events expected or None)."""
    check_outside_retention(before, now=now, retention_months=retention_months)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        months = sorted(m for m in partitions_by_month(conn) if m < before)
    if months:
        directory.mkdir(parents=True, exist_ok=True)
    return [archive_month(dsn, month, directory, on_progress=on_progress, should_stop=should_stop)
            for month in months]


def archive_month(
    dsn: str,
    month: datetime,
    directory: Path,
    *,
    on_progress: Callable[[datetime, int, int | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ArchivedMonth:
    """Write one month's raw events to Parquet, verify the file, drop the month's partitions."""
    path = archive_file(directory, month)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        parts = partitions_by_month(conn).get(month, {})
        earlier = conn.execute("SELECT file, archived_at FROM archived_months WHERE month = %s", (month,)).fetchone()
        conn.commit()
        if earlier is not None:
            raise ArchiveError(
                f"{month:%Y-%m} was archived to {earlier[0]} on {earlier[1]:%Y-%m-%d}, yet has partitions again "
                f"({', '.join(sorted(parts.values()))}): move them aside by hand; the file is not overwritten"
            )
        raw = parts.get("raw_events")
        _write_file(conn, raw, path, month, on_progress, should_stop)
    written = read_checksum(path)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        names = [sql.Identifier(n) for n in sorted(parts.values())]
        try:
            conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.SQL(", ").join(names)))
            count, total = conn.execute(sql.SQL(CHECKSUM_SQL).format(sql.Identifier(raw))).fetchone() if raw else (0, 0)
            stored = f"{int(total) & _MASK:016x}"
            if (count, stored) != (written.count, written.hex):
                raise ArchiveError(
                    f"{month:%Y-%m}: {path} holds {written.count} events (key checksum {written.hex}), the partition "
                    f"{count} ({stored}): it changed since the file was written; nothing dropped, run again"
                )
            conn.execute(PARTITIONS_LOCK)  # no writer creates this month's partitions until we commit
            conn.execute(RECORD_SQL, (month, str(path), count, stored))
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(", ").join(names)))
            conn.commit()
        except psycopg.errors.LockNotAvailable:
            raise ArchiveError(
                f"{month:%Y-%m}: the file is written and verified, but a lock on raw_events or its partitions was not "
                f"granted within {LOCK_TIMEOUT} (a long query reading them?): nothing dropped, run again"
            ) from None
    log.info("archived %s: %d events to %s (verified), its partitions dropped", f"{month:%Y-%m}", count, path)
    return ArchivedMonth(month, path, count, stored)


def _arrow_schema(month: datetime):
    import pyarrow as pa

    stamp = pa.timestamp("us", tz="UTC")
    types = {"occurred_at": stamp, "received_at": stamp}
    meta = {"infermeter.archive": json.dumps({"table": "raw_events", "month": f"{month:%Y-%m}"})}
    return pa.schema([pa.field(c, types.get(c, pa.string()), nullable=False) for c in COLUMNS], metadata=meta)


def _write_file(conn: psycopg.Connection, raw: str | None, path: Path, month: datetime, on_progress,
                should_stop) -> None:
    """The month's raw events, from one snapshot, to `path` (through a temporary file, fsynced)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema(month)
    tmp = path.with_name(f".{path.name}.tmp")
    expected = None
    with conn.transaction():
        if raw is not None:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            estimate = conn.execute("SELECT reltuples FROM pg_class WHERE relname = %s", (raw,)).fetchone()[0]
            expected = int(estimate) if estimate and estimate > 0 else None
        written = 0
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            if raw is not None:
                query = sql.SQL("SELECT {} FROM {}").format(
                    sql.SQL(", ").join(sql.SQL("payload::text") if c == "payload" else sql.Identifier(c) for c in COLUMNS),
                    sql.Identifier(raw))
                with conn.cursor(name="archive_month") as cur:
                    cur.execute(query)
                    while rows := cur.fetchmany(BATCH_ROWS):
                        if should_stop is not None and should_stop():
                            raise Interrupted(f"stopped while archiving {month:%Y-%m}")
                        columns = list(zip(*rows, strict=True))
                        writer.write_table(pa.Table.from_arrays(
                            [pa.array(values, type=schema.field(i).type) for i, values in enumerate(columns)],
                            schema=schema))
                        written += len(rows)
                        if on_progress:
                            on_progress(month, written, expected)
    if on_progress:
        on_progress(month, written, written)
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checksum(path: Path) -> KeyChecksum:
    """Row count and key checksum of an archive file, read back from it."""
    import pyarrow.parquet as pq

    checksum = KeyChecksum()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=["source", "event_id"]):
        for source, event_id in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
            checksum.add(source, event_id)
    return checksum


def archived_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The events of an archive file as `events ingest` publishes lines: (row number, event JSON)."""
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=["payload"]):
        for payload in batch.column(0).to_pylist():
            number += 1
            yield number, payload.encode()


class RetentionJob(Periodic):
    """`infermeter up`'s retirement of storage: at start, then every `interval_s`, archives and drops
    the months before the oldest retained one (by `clock`), and reports what it did."""

    def __init__(self, dsn: str, *, retention_months: int, directory: Path, interval_s: float, clock=None,
                 report: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.dsn = dsn
        self.retention_months = retention_months
        self.directory = directory
        self.interval_s = interval_s
        self.clock = clock or (lambda: datetime.now(UTC))
        self.report = report or log.info

    def run_once(self, *, say_idle: bool = False) -> list[ArchivedMonth]:
        """One pass; reports each month archived, a failure, and with `say_idle` also that there was
        nothing to do."""
        now = self.clock()
        oldest = oldest_retained_month(now, self.retention_months)
        try:
            done = archive_before(self.dsn, oldest, directory=self.directory, now=now,
                                  retention_months=self.retention_months, should_stop=self.stop_event.is_set)
        except Interrupted:
            return []
        except (ArchiveError, psycopg.Error, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.report(f"retention: archiving the months before {oldest:%Y-%m} failed ({first}); "
                        f"next try in {self.interval_s / 3600:g} h")
            return []
        for month in done:
            self.report(f"retention: archived {month.month:%Y-%m} ({month.events:,} events) to {month.file} "
                        "(verified) and dropped its raw_events and event_keys partitions")
        if not done and say_idle:
            self.report(f"retention: keeping {oldest:%Y-%m} onward (INFERMETER_RETENTION_MONTHS="
                        f"{self.retention_months}), nothing older to archive; next check in "
                        f"{self.interval_s / 3600:g} h")
        return done

    thread_name = "metering-retention"

    def _run(self) -> None:
        self.run_once(say_idle=True)
        while not self.stop_event.wait(self.interval_s):
            self.run_once()


__all__ = ["archive_before", "archive_month", "archived_lines", "archive_dir", "archive_file", "parse_month",
           "check_outside_retention", "read_checksum", "KeyChecksum", "ArchivedMonth", "RetentionError",
           "ArchiveError", "RetentionJob"]
