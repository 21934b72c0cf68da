"""Reading a whole topic back (counting events: Tansu's end offsets cannot be trusted)."""

from __future__ import annotations

import time

import orjson

from metering.kafka import list_partitions, make_assigned_consumer
from metering.kafka_types import TopicPartition


def read_events(bootstrap: str, topic: str, expected_unique: int, timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) on `topic` until `expected_unique` distinct (source, id) were seen."""
    deadline = time.monotonic() + timeout_s
    partitions = list_partitions(bootstrap, topic)
    while not partitions and time.monotonic() < deadline:
        time.sleep(0.2)
        partitions = list_partitions(bootstrap, topic)
    consumer = make_assigned_consumer(bootstrap, offsets={TopicPartition(topic, p.partition): 0 for p in partitions})
    seen: set[tuple[str, str]] = set()
    out: list[tuple[bytes | None, bytes]] = []
    try:
        while len(seen) < expected_unique and time.monotonic() < deadline:
            for message in consumer.poll_batch(5000, 0.5):
                event = orjson.loads(message.value)
                seen.add((event["source"], event["id"]))
                out.append((message.key, message.value))
        # a short extra read so that surplus (unexpected) events would show up too
        for message in consumer.poll_batch(5000, 0.3):
            out.append((message.key, message.value))
    finally:
        consumer.close()
    return out


def identities(records: list[tuple[bytes | None, bytes]]) -> list[tuple[str, str]]:
    return [(e["source"], e["id"]) for e in (orjson.loads(v) for _, v in records)]
