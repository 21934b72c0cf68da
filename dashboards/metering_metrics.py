"""Metering's Prometheus metrics, computed from metering's own tables at scrape time (GET
/metrics/metering on the API app): the consumers keep no counters of their own, and the tables are
the truth every other view reads.

| name | type | labels | meaning |
| --- | --- | --- | --- |
| infermeter_metering_consumed_messages_total | counter | group, topic, partition | the committed next offset (consumer_offsets): messages metering has consumed; rate() is the ingest rate |
| infermeter_metering_last_commit_timestamp_seconds | gauge | group, topic, partition | when the partition's offset last moved |
| infermeter_metering_dead_letters_total | counter | reason | events dead-lettered |
| infermeter_metering_event_delay_seconds | gauge | quantile | received_at - event time of the events written in the last 5 minutes (0.5, 0.95, 1) |
| infermeter_metering_events_written_recent | gauge | | events written in the last 5 minutes |
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from metering import ops_reads

CONTENT_TYPE = CONTENT_TYPE_LATEST
OFFSET_LABELS = ["group", "topic", "partition"]


def _families():
    return {
        "consumed": CounterMetricFamily("infermeter_metering_consumed_messages",
                                        "Messages consumed by metering (committed next offset per partition).",
                                        labels=OFFSET_LABELS),
        "commit": GaugeMetricFamily("infermeter_metering_last_commit_timestamp_seconds",
                                    "Unix time the partition's committed offset last moved.", labels=OFFSET_LABELS),
        "dead": CounterMetricFamily("infermeter_metering_dead_letters", "Events dead-lettered, by reason.",
                                    labels=["reason"]),
        "delay": GaugeMetricFamily("infermeter_metering_event_delay_seconds",
                                   "Received time minus event time of the events written in the last 5 minutes.",
                                   labels=["quantile"]),
        "recent": GaugeMetricFamily("infermeter_metering_events_written_recent",
                                    "Events written in the last 5 minutes."),
    }


class MeteringCollector:
    """A prometheus_client collector reading the tables through a psycopg pool on each scrape."""

    def __init__(self, pool):
        self.pool = pool

    def describe(self):
        return list(_families().values())

    def collect(self):
        f = _families()
        now = datetime.now(UTC)
        with self.pool.connection() as conn:
            for row in ops_reads.consumer_progress(conn):
                labels = [row["group_id"], row["topic"], str(row["partition"])]
                f["consumed"].add_metric(labels, row["next_offset"])
                f["commit"].add_metric(labels, datetime.fromisoformat(row["updated_at"].replace("Z", "+00:00")).timestamp())
            for row in ops_reads.dead_letter_reasons(conn):
                f["dead"].add_metric([row["reason"]], row["count"])
            delay = ops_reads.metering_delay(conn, now - timedelta(minutes=5), now)
        for quantile, key in (("0.5", "p50_s"), ("0.95", "p95_s"), ("1", "max_s")):
            if delay[key] is not None:
                f["delay"].add_metric([quantile], delay[key])
        f["recent"].add_metric([], delay["events"])
        return list(f.values())


def registry(pool) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=True)
    reg.register(MeteringCollector(pool))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
