"""Publishing events to the events topic (`infermeter events ingest`, `POST /v1/events`).

Every message carries the header `infermeter-ingest-id`; the metering consumer counts, per ingest
id and in the same transaction as the events, how many were accepted, duplicates or rejected
(`ingest_receipts`). Waiting for an ingest = waiting until those counts add up to what was sent.
Lines that are not JSON never reach Kafka: they are reported with their line number.

Broker ack (`publish_lines`): published straight from the file; Kafka's ack is the promise. Metered
ack (`spool_lines` + `publish_spooled`, the default with the embedded broker): the events go to the
outbox spool INFERMETER_HOME/spool/ingest.sqlite3 first and stay there until metering has recorded
them, so a stack killed with events its broker had acknowledged publishes them again on the next
`infermeter up` (metering/spool.py, metering/publisher.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psycopg

from metering.contract import event_partition_key
from metering.event_identity import identity_of
from metering.kafka import publish_and_wait
from metering.kafka_types import Producer
from metering.processor import INGEST_ID_HEADER
from metering.publisher import Outbox
from metering.spool import Spool

_json = msgspec.json.Decoder()


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


@dataclass
class IngestCounts:
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"accepted": self.accepted, "duplicates": self.duplicates, "rejected": self.rejected}

    @property
    def total(self) -> int:
        return self.accepted + self.duplicates + self.rejected


@dataclass
class Publication:
    ingest_id: str
    published: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            stripped = line.strip()
            if stripped:
                yield number, stripped


def read_events(path: Path) -> Iterator[tuple[int, bytes]]:
    """(number, event JSON) of a file to ingest: a raw-events archive of `infermeter metering archive`
    (`.parquet`: its events as stored, numbered by row), else JSON Lines (numbered by line)."""
    if path.suffix.lower() == ".parquet":
        from metering.archive import archived_lines

        return archived_lines(path)
    return read_lines(path)


def publish_lines(
    producer: Producer,
    topic: str,
    lines: Iterable[tuple[int, bytes]],
    *,
    ingest_id: str | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Publication:
    publication = Publication(ingest_id=ingest_id or uuid.uuid4().hex)

    def events() -> Iterator[tuple[bytes | None, bytes]]:
        for number, raw in lines:
            try:
                parsed = _json.decode(raw)
            except msgspec.DecodeError as exc:
                publication.bad_lines.append(BadLine(number, f"not valid JSON ({exc})"))
                continue
            yield event_partition_key(parsed), raw

    result = publish_and_wait(
        producer,
        topic,
        events(),
        headers={INGEST_ID_HEADER: publication.ingest_id.encode()},
        timeout_s=60,
        progress_every=10_000,
        on_progress=on_progress,
    )
    publication.published = result.published
    if result.unacknowledged or result.failures:
        detail = f"{result.unacknowledged} not acknowledged" if result.unacknowledged else str(result.failures[0])
        raise RuntimeError(f"Kafka did not take every event ({detail}); re-run the same ingest: duplicates are dropped")
    if on_progress:
        on_progress(publication.published)
    return publication


@dataclass
class SpooledIngest:
    """An ingest taken into the outbox spool: rows first..last of `spool` carry its ingest id."""

    ingest_id: str
    first: int = 0
    last: int = -1
    published: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)

    @property
    def spooled(self) -> int:
        return self.last - self.first + 1


def spool_lines(
    spool: Spool, lines: Iterable[tuple[int, bytes]], *, ingest_id: str | None = None, chunk: int = 20_000
) -> SpooledIngest:
    """Append every JSON line to the spool (durable when this returns), in transactions of `chunk`
    rows; lines that are not JSON are reported, not spooled."""
    taken = SpooledIngest(ingest_id=ingest_id or uuid.uuid4().hex)
    rows: list[tuple] = []

    def flush() -> None:
        first, last = spool.append_many(rows, ingest_id=taken.ingest_id)
        if taken.last < taken.first:
            taken.first = first
        taken.last = last
        rows.clear()

    for number, raw in lines:
        try:
            parsed = _json.decode(raw)
        except msgspec.DecodeError as exc:
            taken.bad_lines.append(BadLine(number, f"not valid JSON ({exc})"))
            continue
        rows.append((event_partition_key(parsed), raw, identity_of(parsed)))
        if len(rows) >= chunk:
            flush()
    if rows:
        flush()
    return taken


def publish_spooled(
    outbox: Outbox,
    producer: Producer,
    taken: SpooledIngest,
    *,
    on_progress: Callable[[int], None] | None = None,
    chunk: int = 20_000,
) -> SpooledIngest:
    """Publish this ingest's spooled rows (claimed chunk by chunk: rows another publisher of the same
    spool took meanwhile are its to publish). Rows stay in the spool, published, until metering
    confirms them (the confirmer of `infermeter up`, or `confirm_spooled`). A broker failure raises
    RuntimeError; the rows not acknowledged go back to pending, for `infermeter up` to publish."""
    for first in range(taken.first, taken.last + 1, chunk):
        batch = outbox.spool.claim_range(first, min(first + chunk - 1, taken.last))
        if not batch:
            continue
        acked, failed = outbox.publish(producer, batch, track=False)
        taken.published += len(acked)
        if failed:
            outbox.spool.release(set(e.seq for e in batch) - set(acked))
            raise RuntimeError(
                f"Kafka did not take every event ({outbox.last_error or f'{failed} not acknowledged'}); "
                f"they stay in {outbox.spool.path}: `infermeter up` publishes them"
            )
        if on_progress:
            on_progress(taken.published)
    # Rows claimed by another publisher (a stack's replayer) are on their way too.
    taken.published = taken.spooled
    if on_progress:
        on_progress(taken.published)
    return taken


def receipt(dsn: str, ingest_id: str) -> IngestCounts:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT accepted, duplicates, rejected FROM ingest_receipts WHERE ingest_id = %s", (ingest_id,)
        ).fetchone()
    return IngestCounts(*row) if row else IngestCounts()


def wait_for_receipt(
    dsn: str,
    ingest_id: str,
    expected: int,
    *,
    timeout_s: float = 600,
    on_progress: Callable[[IngestCounts], None] | None = None,
    still_running: Callable[[], bool] | None = None,
) -> IngestCounts:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = receipt(dsn, ingest_id)
        if on_progress:
            on_progress(counts)
        if counts.total >= expected:
            return counts
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"metering has handled {counts.total} of {expected} events after {timeout_s:.0f} s "
                "(is `infermeter metering run` or `infermeter up` running?)"
            )
        if still_running is not None and not still_running():
            raise RuntimeError("the metering consumer stopped before every event was handled")
        time.sleep(0.2)
