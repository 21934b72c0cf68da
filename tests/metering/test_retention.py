"""Bounded storage: the retention, archive -> drop -> replay, deduplication over monthly partitions.

Clocks are frozen: every writer and consumer here gets its own `clock`, and the archive its `now`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
import pyarrow.parquet as pq
import pytest

from infermeter.db import upgrade
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import add_months, month_start
from metering.archive import RetentionJob, archive_before, archive_file, read_checksum
from metering.consumer import MeteringConsumer, run_in_thread
from metering.contract import REPLICA_V1, encode_event, make_event
from metering.kafka_types import Message
from metering.processor import oldest_retained_month, process
from metering.writer import BatchWriter
from tests.conftest import new_database
from tests.metering.conftest import (
    ROLLUP_TABLES,
    dsn,
    mixed_stream,
    request_event,
    subprocess_env,
    task_event,
    usage_event,
)
from tests.test_migrations import _fresh_database


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _messages(lines, start_offset=0):
    return [Message("events", 0, start_offset + i, None, line, {}, None) for i, line in enumerate(lines)]


class Feed:
    """A BatchWriter with a frozen clock (`now`, moved by the test) and offsets of its own."""

    def __init__(self, libpq_dsn: str, now: datetime, retention_months: int):
        self.now = now
        self.writer = BatchWriter(libpq_dsn, group_id="retention", max_bytes=65536, future_tolerance_s=300,
                                  clock=lambda: self.now, retention_months=retention_months)
        self.offset = 0

    def write(self, lines):
        result = self.writer.write(_messages(lines, self.offset))
        self.offset += len(lines)
        return result

    def close(self):
        self.writer.close()


def rollups(settings) -> dict[str, list[tuple]]:
    with psycopg.connect(dsn(settings)) as conn:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
                for table, order in ROLLUP_TABLES.items()}


def raw_events(settings) -> list[tuple]:
    with psycopg.connect(dsn(settings)) as conn:
        return conn.execute("SELECT source, event_id, payload FROM raw_events ORDER BY source, event_id").fetchall()


def partitions(settings) -> dict[str, list[str]]:
    with psycopg.connect(dsn(settings)) as conn:
        rows = conn.execute(
            "SELECT p.relname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname IN ('raw_events', 'event_keys') ORDER BY 2"
        ).fetchall()
    out: dict[str, list[str]] = {"raw_events": [], "event_keys": []}
    for parent, name in rows:
        out[parent].append(name)
    return out


# --- the retained window (pure) -------------------------------------------------------------------


@pytest.mark.parametrize(("now", "months", "oldest"), [
    ("2026-11-20T12:00:00Z", 13, "2025-11-01T00:00:00Z"),
    ("2026-11-01T00:00:00Z", 13, "2025-11-01T00:00:00Z"),
    ("2026-10-31T23:59:59.999999Z", 13, "2025-10-01T00:00:00Z"),
    ("2026-01-15T00:00:00Z", 1, "2026-01-01T00:00:00Z"),
    ("2026-01-15T00:00:00Z", 2, "2025-12-01T00:00:00Z"),
    ("2026-03-31T23:00:00-05:00", 3, "2026-02-01T00:00:00Z"),  # 04:00 UTC on April 1st
])
def test_the_retained_window_is_the_current_utc_month_and_the_months_before(now, months, oldest):
    assert oldest_retained_month(at(now), months) == at(oldest)


def test_an_event_from_the_first_instant_of_the_oldest_month_is_kept_and_one_microsecond_earlier_is_too_old():
    now = at("2026-11-20T12:00:00Z")
    first = at("2025-11-01T00:00:00Z")
    lines = [request_event(1, at=first), request_event(2, at=first - timedelta(microseconds=1))]
    batch = process(_messages(lines), now=now, max_bytes=65536, future_tolerance_s=300, retention_months=13)
    assert [row[2] for row in batch.stage_rows] == ["r-1"]
    [dead] = batch.dead_letters
    assert (dead.reason, dead.event_id) == ("too_old", "r-2")
    assert dead.detail == (
        "time 2025-10-31T23:59:59.999999Z is before 2025-11, the oldest month metering keeps "
        "(INFERMETER_RETENTION_MONTHS=13): older months are archived, so a duplicate could no longer be recognised")
    unbounded = process(_messages(lines), now=now, max_bytes=65536, future_tolerance_s=300)
    assert len(unbounded.stage_rows) == 2 and not unbounded.dead_letters


def test_the_retention_is_judged_from_its_own_now_and_the_future_tolerance_from_the_clock():
    # a November 2026 event read in June 2028: 13 months back from the clock it is too old; from a
    # retention now of 2026-12-01 it is kept (the oldest month 2025-12), and one from 2025-11 is not
    clock = at("2028-06-15T12:00:00Z")
    lines = [request_event(1, at=at("2026-11-02T10:00:00Z")), request_event(2, at=at("2025-11-30T23:59:59Z")),
             request_event(3, at=clock + timedelta(seconds=301))]
    on_the_clock = process(_messages(lines), now=clock, max_bytes=65536, future_tolerance_s=300, retention_months=13)
    assert [(d.event_id, d.reason) for d in on_the_clock.dead_letters] == [
        ("r-1", "too_old"), ("r-2", "too_old"), ("r-3", "future_time")]
    frozen = process(_messages(lines), now=clock, max_bytes=65536, future_tolerance_s=300, retention_months=13,
                     retention_now=at("2026-12-01T00:00:00Z"))
    assert [row[2] for row in frozen.stage_rows] == ["r-1"]
    assert [(d.event_id, d.reason) for d in frozen.dead_letters] == [("r-2", "too_old"), ("r-3", "future_time")]
    assert "before 2025-12, the oldest month metering keeps" in frozen.dead_letters[0].detail


def test_a_writer_judges_the_retention_from_its_retention_clock():
    writer = BatchWriter("postgresql://unused", group_id="g", max_bytes=65536, future_tolerance_s=300,
                         clock=lambda: at("2028-06-15T12:00:00Z"), retention_months=13,
                         retention_clock=lambda: at("2026-12-01T00:00:00Z"))
    prepared = writer.prepare(_messages([request_event(1, at=at("2026-11-02T10:00:00Z"))]))
    assert [row[2] for row in prepared.batch.stage_rows] == ["r-1"] and not prepared.batch.dead_letters
    on_the_clock = BatchWriter("postgresql://unused", group_id="g", max_bytes=65536, future_tolerance_s=300,
                               clock=lambda: at("2028-06-15T12:00:00Z"), retention_months=13)
    assert [d.reason for d in on_the_clock.prepare(_messages([request_event(1, at=at("2026-11-02T10:00:00Z"))]))
            .batch.dead_letters] == ["too_old"]


# --- too old: dead-lettered, the rest of the batch lands ------------------------------------------


def test_a_too_old_event_is_dead_lettered_with_its_reason_and_the_rest_of_its_batch_lands(settings):
    now = at("2026-11-20T12:00:00Z")
    feed = Feed(dsn(settings), now, retention_months=13)
    good = [request_event(i, at=at("2026-11-02T10:00:00Z") + timedelta(minutes=i)) for i in range(10)]
    old = request_event(99, at=at("2025-10-31T23:00:00Z"))
    result = feed.write(good[:5] + [old] + good[5:])
    feed.close()
    assert (result.accepted, result.duplicates, result.rejected) == (10, 0, 1)
    with psycopg.connect(dsn(settings)) as conn:
        dead = conn.execute("SELECT reason, detail, event_id, \"offset\" FROM dead_letters").fetchall()
        assert conn.execute("SELECT sum(requests) FROM request_rollup_hourly").fetchone() == (10,)
        assert conn.execute("SELECT count(*) FROM raw_events WHERE occurred_at < '2026-11-01'").fetchone() == (0,)
    assert dead == [("too_old", "time 2025-10-31T23:00:00Z is before 2025-11, the oldest month metering keeps "
                     "(INFERMETER_RETENTION_MONTHS=13): older months are archived, so a duplicate could no longer "
                     "be recognised", "r-99", 5)]
    assert partitions(settings)["raw_events"] == ["raw_events_2026_11"]  # nothing made for the old month

    # `events dead-letters` shows the reason like any other
    shown = subprocess.run([sys.executable, "-m", "app.cli", "events", "dead-letters", "--reason", "too_old", "--json"],
                           env=subprocess_env(settings), capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)["dead_letters"]
    assert (row["reason"], row["event_id"]) == ("too_old", "r-99") and "INFERMETER_RETENTION_MONTHS" in row["detail"]


# --- duplicates inside the retention, across a partition rotation ---------------------------------


def test_a_duplicate_inside_the_retention_is_dropped_after_a_partition_rotation(settings, tmp_path):
    feed = Feed(dsn(settings), at("2026-10-20T12:00:00Z"), retention_months=2)  # keeps 2026-09 and 2026-10
    september = [request_event(i, at=at("2026-09-10T08:00:00Z") + timedelta(minutes=i)) for i in range(5)]
    october = [request_event(10 + i, at=at("2026-10-05T08:00:00Z") + timedelta(minutes=i)) for i in range(5)]
    assert feed.write(september + october).accepted == 10

    feed.now = at("2026-11-03T09:00:00Z")  # keeps 2026-10 and 2026-11: a new month's partitions
    november = [request_event(20 + i, at=at("2026-11-02T08:00:00Z") + timedelta(minutes=i)) for i in range(5)]
    assert feed.write(november).accepted == 5
    done = archive_before(dsn(settings), at("2026-10-01T00:00:00Z"), directory=tmp_path / "archive",
                          now=feed.now, retention_months=2)
    assert [(f"{m.month:%Y-%m}", m.events) for m in done] == [("2026-09", 5)]
    assert partitions(settings) == {"raw_events": ["raw_events_2026_10", "raw_events_2026_11"],
                                    "event_keys": ["event_keys_2026_10", "event_keys_2026_11"]}
    before = rollups(settings)

    again = feed.write(october[:2] + november[:2])  # re-sent as they were
    assert (again.accepted, again.duplicates, again.rejected) == (0, 4, 0)
    same_id_other_day = request_event(11, at=at("2026-10-28T23:59:59Z"), output=999)  # (source, r-11), October again
    moved = feed.write([same_id_other_day])
    assert (moved.accepted, moved.duplicates) == (0, 1)
    assert rollups(settings) == before

    # September left the retention: its events are too old, not duplicates, and its partitions stay gone
    late = feed.write([september[0]])
    assert (late.accepted, late.duplicates, late.rejected) == (0, 0, 1)
    fresh = BatchWriter(dsn(settings), group_id="other", max_bytes=65536, future_tolerance_s=300)
    fresh.ensure_partitions({at("2026-09-01T00:00:00Z")})  # an archived month is never created again
    fresh.close()
    assert "raw_events_2026_09" not in partitions(settings)["raw_events"]

    # The rule: identity is (source, id) within a month of event time. The same id with a time in
    # another retained month is another event.
    reused = feed.write([request_event(10, at=at("2026-11-02T12:00:00Z"))])
    assert (reused.accepted, reused.duplicates) == (1, 0)
    feed.close()


# --- archive -> drop -> replay ---------------------------------------------------------------------


def _replica_event(i: int, start: datetime) -> bytes:
    return encode_event(make_event(
        REPLICA_V1, source="//test/agent", subject="cust-1", event_id=f"rep-{i}", time=start + timedelta(seconds=90),
        data={"replica_id": "rep-a", "deployment_id": "d1", "customer_id": "cust-1", "gpu_type": "L4", "gpu_count": 2,
              "interval_start": start, "interval_end": start + timedelta(seconds=90), "busy_seconds": "61.5",
              "prompt_tokens": 1200, "generation_tokens": 340, "kv_cache_usage": "0.25",
              "requests_waiting": "1.5", "requests_running": "3", "region": "eu-west"},
    ))


def _two_months() -> list[bytes]:
    """Every kind of event, in October and November 2026 (some across the month's edge), filling every
    rollup and ledger table."""
    october = at("2026-10-31T23:30:00Z")
    lines = mixed_stream(120)  # November: requests (regions, tasks, retries), outcomes, tool usage
    lines += [request_event(1000 + i, customer=f"cust-{i % 3}", at=october + timedelta(minutes=7 * i), task_id="t-oct",
                            attempt=1 + i % 2, region=("eu-west", None)[i % 2]) for i in range(20)]
    lines += [task_event("t-oct", "cust-0", "failed", october + timedelta(minutes=5)),
              usage_event(500, "cust-0", "tool_calls", "1.25", october, task_id="t-oct"),
              usage_event(501, "cust-2", "verifications", "3", at("2026-11-30T23:59:59.999999Z"))]
    lines += [_replica_event(i, october + timedelta(minutes=20 * i)) for i in range(6)]
    return lines


def test_archive_drop_then_replay_into_an_empty_database_gives_identical_rollups_and_raw_events(
        settings, pg_server_url, tmp_path):
    feed = Feed(dsn(settings), at("2026-11-30T23:59:59Z"), retention_months=13)
    lines = _two_months()
    assert feed.write(lines).accepted == len(lines)
    feed.close()
    reference = rollups(settings)
    assert all(reference[table] for table in ROLLUP_TABLES), {t: len(r) for t, r in reference.items()}
    stored = raw_events(settings)

    # A year later both months have left the retention; an earlier crash left a stale file behind.
    later = at("2027-12-05T10:00:00Z")
    folder = tmp_path / "archive"
    folder.mkdir()
    archive_file(folder, at("2026-10-01T00:00:00Z")).write_bytes(b"a crash left this half-written")
    done = archive_before(dsn(settings), at("2026-12-01T00:00:00Z"), directory=folder, now=later,
                          retention_months=13)
    assert [f"{m.month:%Y-%m}" for m in done] == ["2026-10", "2026-11"]
    assert sum(m.events for m in done) == len(lines)
    for month in done:
        written = read_checksum(month.file)
        assert (written.count, written.hex) == (month.events, month.key_checksum)
    assert sorted(p.name for p in folder.iterdir()) == ["raw_events_2026_10.parquet", "raw_events_2026_11.parquet"]
    assert partitions(settings) == {"raw_events": [], "event_keys": []}
    assert raw_events(settings) == []
    assert rollups(settings) == reference  # rollups and ledgers are kept
    with psycopg.connect(dsn(settings)) as conn:
        assert conn.execute("SELECT to_char(month, 'YYYY-MM'), events FROM archived_months ORDER BY month").fetchall() \
            == [("2026-10", done[0].events), ("2026-11", done[1].events)]
    assert archive_before(dsn(settings), at("2026-12-01T00:00:00Z"), directory=folder, now=later,
                          retention_months=13) == []  # a second run finds nothing to do

    # Replay: `events ingest FILE.parquet --wait` into an empty database, metered by a consumer whose
    # retention covers the archive's months (INFERMETER_RETENTION_MONTHS=15 at the same clock).
    replay = settings.model_copy(update={"database_url": new_database(pg_server_url), "retention_months": 15,
                                         "topic_prefix": settings.topic_prefix + "r",
                                         "consumer_group": settings.consumer_group + "r"})
    consumer = MeteringConsumer(replay, replay.database_url, replay.kafka_bootstrap, clock=lambda: later)
    thread = run_in_thread(consumer)
    try:
        for month in done:
            ingest = subprocess.run(
                [sys.executable, "-m", "app.cli", "events", "ingest", str(month.file), "--wait", "--json"],
                env=subprocess_env(replay, INFERMETER_RETENTION_MONTHS="15"), capture_output=True, text=True,
                timeout=300)
            assert ingest.returncode == 0, ingest.stderr
            assert json.loads(ingest.stdout) == {"accepted": month.events, "duplicates": 0, "rejected": 0}
    finally:
        consumer.stop()
        thread.join(30)
    assert rollups(replay) == reference
    assert raw_events(replay) == stored


def test_the_retention_job_of_up_archives_what_left_the_retention_and_says_so(settings, tmp_path):
    feed = Feed(dsn(settings), at("2026-10-20T12:00:00Z"), retention_months=13)
    feed.write([request_event(i, at=at("2026-09-10T08:00:00Z") + timedelta(hours=i)) for i in range(3)]
               + [request_event(10, at=at("2026-10-10T08:00:00Z"))])
    feed.close()
    said: list[str] = []
    clock = [at("2026-11-01T00:00:00Z")]
    job = RetentionJob(dsn(settings), retention_months=2, directory=tmp_path / "a", interval_s=86400,
                       clock=lambda: clock[0], report=said.append)
    assert job.run_once(say_idle=True)[0].events == 3
    assert said == [f"retention: archived 2026-09 (3 events) to {tmp_path / 'a' / 'raw_events_2026_09.parquet'} "
                    "(verified) and dropped its raw_events and event_keys partitions"]
    assert job.run_once(say_idle=True) == []
    assert said[-1] == ("retention: keeping 2026-10 onward (INFERMETER_RETENTION_MONTHS=2), nothing older to "
                        "archive; next check in 24 h")
    table = pq.read_table(tmp_path / "a" / "raw_events_2026_09.parquet")
    assert table.column_names == ["occurred_at", "source", "event_id", "type", "customer_id", "received_at", "payload"]
    assert sorted(table.column("event_id").to_pylist()) == ["r-0", "r-1", "r-2"]


# --- the migration -----------------------------------------------------------------------------------


def test_the_migration_keeps_every_stored_key_in_its_month_and_deduplication_still_works(pg_server_url):
    name = "t_retention_0015"
    url = _fresh_database(pg_server_url, name)
    try:
        upgrade(url, "0013")
        months = ["2026-08", "2026-09", "2026-10", "2026-11"]
        keys = [("//test/gw", f"r-{i}", at(f"{months[i % 4]}-0{1 + i % 9}T10:00:00Z") + timedelta(minutes=i))
                for i in range(400)]
        with psycopg.connect(to_libpq_url(url)) as conn:
            for month in months[1:]:  # August has keys but no raw partition (dropped by hand, say)
                start = at(f"{month}-01T00:00:00Z")
                conn.execute(f"CREATE TABLE raw_events_{start:%Y_%m} PARTITION OF raw_events "
                             f"FOR VALUES FROM ('{start.isoformat()}') TO ('{add_months(start, 1).isoformat()}')")
            with conn.cursor().copy("COPY event_keys (source, event_id, occurred_at) FROM STDIN") as copy:
                for key in keys:
                    copy.write_row(key)
        upgrade(url)
        with psycopg.connect(to_libpq_url(url)) as conn:
            kept = conn.execute("SELECT source, event_id, occurred_at FROM event_keys").fetchall()
            per_partition = conn.execute(
                "SELECT c.relname, pg_get_constraintdef(k.oid), (SELECT count(*) FROM event_keys e "
                "  WHERE e.tableoid = c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'p' "
                "WHERE i.inhparent = 'event_keys'::regclass ORDER BY 1").fetchall()
        assert sorted(kept) == sorted(keys)
        assert per_partition == [(f"event_keys_{m.replace('-', '_')}", "PRIMARY KEY (source, event_id)", 100)
                                 for m in months]

        feed = Feed(to_libpq_url(url), at("2026-11-20T12:00:00Z"), retention_months=13)
        old = [request_event(i, at=keys[i][2]) for i in range(8)]  # the stored events, sent again
        new = [request_event(1000 + i, at=at("2026-11-20T11:00:00Z")) for i in range(3)]
        result = feed.write(old + new)
        assert (result.accepted, result.duplicates) == (3, 8)
        assert feed.write(new).duplicates == 3
        feed.close()
    finally:
        with psycopg.connect(to_libpq_url(pg_server_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- the CLI refuses a month inside the retention -----------------------------------------------------


def test_archiving_a_month_inside_the_retention_is_refused_in_one_line_and_changes_nothing(settings, tmp_path):
    now = datetime.now(UTC)  # the command's own clock
    this_month = month_start(now)
    writer = BatchWriter(dsn(settings), group_id="g", max_bytes=65536, future_tolerance_s=300)
    writer.ensure_partitions({this_month, add_months(this_month, -1)})
    writer.close()
    before = partitions(settings)
    folder = tmp_path / "archive"
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "metering", "archive", "--before", f"{add_months(this_month, 1):%Y-%m}"],
        env=subprocess_env(settings, INFERMETER_ARCHIVE_DIR=str(folder),
                           INFERMETER_RETENTION_MONTHS="13"), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: refusing to archive up to {this_month:%Y-%m}: INFERMETER_RETENTION_MONTHS=13 "
                               f"keeps {add_months(this_month, -12):%Y-%m} to {this_month:%Y-%m}")
    assert "Traceback" not in result.stderr + result.stdout
    assert not folder.exists()
    assert partitions(settings) == before
