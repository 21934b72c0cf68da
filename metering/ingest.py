"""Publishing events to the events topic (`infermeter events ingest`, `POST /v1/events`).

Every message carries the header `infermeter-ingest-id`; the metering consumer counts, per ingest
id and in the same transaction as the events, how many were accepted, duplicates or rejected
(`ingest_receipts`). Waiting for an ingest = waiting until those counts add up to what was sent.
Lines that are not JSON never reach Kafka: they are reported with their line number.
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
from metering.kafka import Producer, publish_and_wait
from metering.processor import INGEST_ID_HEADER

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
