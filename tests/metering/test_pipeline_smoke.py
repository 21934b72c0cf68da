from __future__ import annotations

import json

import psycopg

from infermeter.stack import to_libpq_url
from metering.consumer import MeteringConsumer, run_in_thread
from metering.ingest import publish_lines, wait_for_receipt
from metering.kafka import ensure_topics, make_producer
from metering.schemas import EXAMPLES_DIR


def test_examples_flow_through(settings):
    ensure_topics(settings.kafka_bootstrap, settings)
    lines = []
    for n, path in enumerate(sorted((EXAMPLES_DIR / "valid").glob("*.json")) + sorted((EXAMPLES_DIR / "invalid").iterdir()), 1):
        lines.append((n, path.read_bytes().replace(b"\n", b" ")))
    producer = make_producer(settings.kafka_bootstrap)
    pub = publish_lines(producer, settings.events_topic, lines)
    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap)
    thread = run_in_thread(consumer)
    counts = wait_for_receipt(to_libpq_url(settings.database_url), pub.ingest_id, pub.published, timeout_s=60)
    consumer.stop(); thread.join(20)
    print(pub.bad_lines, counts)
    assert counts.accepted == 8
    with psycopg.connect(to_libpq_url(settings.database_url)) as conn:
        print(conn.execute("select * from request_rollup_hourly").fetchall())
        print(conn.execute("select * from gpu_ledger_hourly").fetchall())
        print(conn.execute("select reason, count(*) from dead_letters group by 1").fetchall())
