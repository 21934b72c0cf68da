"""Raw consume-only rate of a Kafka client backend: the ceiling the metering consumer is measured against.

    python -m bench.raw_consume [--events 200000] [--size 300] [--partitions 8]
                                [--backend confluent|kafka-python|both] [--json]

Produces N messages of SIZE bytes (keyed over 1,000 customers, confluent producer) to a fresh
8-partition topic, then for each backend reads them back, outside any consumer group, with every
partition assigned from offset 0, until exactly N messages were seen (never from end offsets: Tansu
reports them wrong). Two modes per backend:
- `client`: the client library alone (confluent `consume()`, kafka-python `poll()`), counting;
- `wrapper`: through metering.kafka's `poll_batch` (builds a `Message` per record): what the
  metering consumer pays before doing any work.
Uses KAFKA_BOOTSTRAP when set, otherwise starts a private Tansu broker for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

from rich.console import Console

from metering import kafka as mk

MODES = ("client", "wrapper")


def produce_messages(bootstrap: str, topic: str, count: int, size: int, *, customers: int = 1000) -> float:
    """Produce `count` messages of `size` bytes to `topic`; returns messages/s (acked)."""
    producer = mk.make_producer(bootstrap, "confluent", linger_ms=20)
    body = b"x" * size
    started = time.perf_counter()
    for i in range(count):
        stamp = b"%010d" % i
        producer.produce(topic, stamp + body[len(stamp) :], key=b"customer-%d" % (i % customers))
        if i % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    producer.close()
    if remaining:
        raise RuntimeError(f"{remaining} message(s) were not acknowledged by {bootstrap}")
    return count / elapsed


def consume_count(
    bootstrap: str,
    backend: str,
    topic: str,
    expected: int,
    timeout_s: float = 300.0,
    *,
    mode: str = "wrapper",
    batch: int = 10000,
) -> float:
    """Events/s of reading `expected` messages of `topic` from offset 0 on every partition.

    The clock starts when the partitions are assigned (connection set up) and stops at the
    `expected`-th message. Raises RuntimeError if fewer arrive within `timeout_s`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    partitions = mk.list_partitions(bootstrap, topic, backend=backend)
    if not partitions:
        raise RuntimeError(f"topic {topic} does not exist on {bootstrap}")
    if mode == "wrapper":
        return _count_wrapper(bootstrap, backend, partitions, expected, timeout_s, batch)
    if backend == "confluent":
        return _count_confluent(bootstrap, partitions, expected, timeout_s, batch)
    if backend == "kafka-python":
        return _count_kafka_python(bootstrap, partitions, expected, timeout_s, batch)
    raise mk.UnknownBackend(f"unknown Kafka backend {backend!r}")


def _finish(seen: int, expected: int, started: float) -> float:
    elapsed = time.perf_counter() - started
    if seen < expected:
        raise RuntimeError(f"saw {seen} of {expected} messages before the timeout")
    return seen / elapsed


def _count_wrapper(bootstrap, backend, partitions, expected, timeout_s, batch) -> float:
    consumer = mk.make_assigned_consumer(bootstrap, backend=backend, offsets={tp: 0 for tp in partitions})
    try:
        seen = 0
        started = time.perf_counter()
        deadline = started + timeout_s
        while seen < expected and time.perf_counter() < deadline:
            seen += len(consumer.poll_batch(batch, 0.5))
        return _finish(seen, expected, started)
    finally:
        consumer.close()


def _count_confluent(bootstrap, partitions, expected, timeout_s, batch) -> float:
    import confluent_kafka as ck

    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 100000,
        }
    )
    try:
        consumer.assign([ck.TopicPartition(tp.topic, tp.partition, 0) for tp in partitions])
        seen = 0
        started = time.perf_counter()
        deadline = started + timeout_s
        while seen < expected and time.perf_counter() < deadline:
            for msg in consumer.consume(batch, 0.5):
                if msg.error() is None:
                    seen += 1
        return _finish(seen, expected, started)
    finally:
        consumer.close()


def _count_kafka_python(bootstrap, partitions, expected, timeout_s, batch) -> float:
    import kafka

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100, max_poll_records=batch
    )
    try:
        raw = [kafka.TopicPartition(tp.topic, tp.partition) for tp in partitions]
        consumer.assign(raw)
        for tp in raw:
            consumer.seek(tp, 0)
        seen = 0
        started = time.perf_counter()
        deadline = started + timeout_s
        while seen < expected and time.perf_counter() < deadline:
            for records in consumer.poll(timeout_ms=500, max_records=batch).values():
                seen += len(records)
        return _finish(seen, expected, started)
    finally:
        consumer.close(autocommit=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw_consume", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="messages to produce and read (200000)")
    parser.add_argument("--size", type=int, default=300, help="bytes per message value (300)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topic (8)")
    parser.add_argument("--backend", choices=(*mk.BACKENDS, "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print only a JSON object")
    args = parser.parse_args(argv)
    console = Console(stderr=True, quiet=args.json)

    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        from infermeter.stack.broker import start_tansu

        broker = start_tansu()
        bootstrap = broker.bootstrap
    try:
        topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
        mk.create_topic(bootstrap, topic, args.partitions)
        with console.status(f"producing {args.events:,} messages of {args.size} bytes"):
            produce_rate = produce_messages(bootstrap, topic, args.events, args.size)
        console.print(f"produced {args.events:,} messages at {produce_rate:,.0f}/s (confluent, acks=all)")
        backends = mk.BACKENDS if args.backend == "both" else (args.backend,)
        rows = []
        for backend in backends:
            for mode in MODES:
                with console.status(f"reading with {backend} ({mode})"):
                    rate = consume_count(bootstrap, backend, topic, args.events, mode=mode)
                console.print(f"{backend:13} {mode:8} {rate:>10,.0f} events/s")
                rows.append({"backend": backend, "mode": mode, "raw_consume_events_per_s": round(rate)})
        result = {
            "events": args.events,
            "size_bytes": args.size,
            "partitions": args.partitions,
            "produce_events_per_s": round(produce_rate),
            "rows": rows,
        }
        if args.json:
            print(json.dumps(result))
        return 0
    except mk.KafkaError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        if broker is not None:
            broker.process.kill()
            broker.process.wait(10)


if __name__ == "__main__":
    sys.exit(main())
