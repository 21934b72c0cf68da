"""No usage lost, none counted twice: replays, duplicates, shuffles, late events."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from metering import queries
from metering.kafka_types import Message
from metering.processor import process
from metering.writer import BatchWriter
from tests.metering.conftest import dsn, meter, mixed_stream, request_event, snapshot

NOW = datetime(2026, 11, 29, tzinfo=UTC)


def test_same_file_twice_and_a_shuffled_copy_with_duplicates_give_identical_rollups(settings, db_url, pg_server_url):
    lines = mixed_stream(400)
    first = meter(settings, lines)
    assert (first.accepted, first.duplicates, first.rejected) == (len(lines), 0, 0)
    reference = snapshot(settings)
    assert reference["raw_events"] == [(len(lines), len(lines))]

    again = meter(settings, lines)
    assert (again.accepted, again.duplicates, again.rejected) == (0, len(lines), 0)
    assert snapshot(settings) == reference

    # A fresh database fed a shuffled copy with 5% duplicates ends identical to the clean run.
    from tests.conftest import new_database

    other = settings.model_copy(update={"database_url": new_database(pg_server_url),
                                        "topic_prefix": settings.topic_prefix + "b",
                                        "consumer_group": settings.consumer_group + "b"})
    rng = random.Random(5)
    noisy = lines + rng.sample(lines, len(lines) // 20)
    rng.shuffle(noisy)
    counts = meter(other, noisy)
    assert counts.accepted == len(lines)
    assert counts.duplicates == len(lines) // 20
    assert snapshot(other) == reference


def _messages(lines, start_offset=0, partition=0):
    return [Message("events", partition, start_offset + i, None, line, {}, None) for i, line in enumerate(lines)]


def test_processing_the_same_messages_twice_gives_the_same_rows():
    lines = mixed_stream(50)
    one = process(_messages(lines), now=NOW, max_bytes=65536, future_tolerance_s=300)
    two = process(_messages(lines), now=NOW, max_bytes=65536, future_tolerance_s=300)
    assert one.stage_rows == two.stage_rows
    assert one.gpu_rows == two.gpu_rows
    assert one.dead_letters == two.dead_letters


def test_writing_a_batch_twice_changes_nothing(settings):
    writer = BatchWriter(dsn(settings), group_id="g1", max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)
    batch = _messages(mixed_stream(120))
    first = writer.write(batch)
    assert first.accepted == 120 + 24 // 2 + 12
    before = snapshot(settings)
    replay = writer.write(batch)  # same offsets: fenced off as already written
    assert (replay.skipped, replay.accepted, replay.duplicates) == (len(batch), 0, 0)
    moved = writer.write(_messages([m.value for m in batch], start_offset=10_000))  # same events, new offsets
    assert (moved.accepted, moved.duplicates) == (0, len(batch))
    assert snapshot(settings) == before
    writer.close()


def test_late_events_land_in_their_own_hour_and_day(settings):
    settings = settings.model_copy(update={"retention_months": 120})  # backfills of any age inside the retention
    on_time = [request_event(i, at=datetime(2026, 11, 2, 10, 15, tzinfo=UTC)) for i in range(3)]
    meter(settings, on_time)
    late = [
        request_event(100, at=datetime(2026, 11, 1, 23, 59, 59, 999999, tzinfo=UTC), output=7),
        request_event(101, at=datetime(2025, 6, 30, 12, 0, tzinfo=UTC), output=5),  # an old backfill
    ]
    assert meter(settings, late).accepted == 2
    with psycopg.connect(dsn(settings)) as conn:
        hours = conn.execute("SELECT hour, requests, output_tokens FROM request_rollup_hourly ORDER BY hour").fetchall()
        by_day = queries.usage(conn, queries.Window(datetime(2025, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
                               group_by=["day"])
    assert [(h.isoformat(), n, out) for h, n, out in hours] == [
        ("2025-06-30T12:00:00+00:00", 1, 5),
        ("2026-11-01T23:00:00+00:00", 1, 7),
        ("2026-11-02T10:00:00+00:00", 3, 30),
    ]
    assert [(r["day"], r["requests"]) for r in by_day] == [
        ("2025-06-30T00:00:00Z", 1), ("2026-11-01T00:00:00Z", 1), ("2026-11-02T00:00:00Z", 3)]


def test_windows_are_half_open_and_exact_inside_an_hour(settings):
    base = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    meter(settings, [request_event(i, at=base + timedelta(minutes=10 * i), output=1) for i in range(12)])
    with psycopg.connect(dsn(settings)) as conn:
        def total(start, end):
            rows = queries.usage(conn, queries.Window(start, end))
            return sum(r["requests"] for r in rows)

        assert total(base, base + timedelta(hours=2)) == 12
        assert total(base + timedelta(minutes=10), base + timedelta(minutes=30)) == 2  # [10, 30)
        assert total(base + timedelta(minutes=5), base + timedelta(hours=1, minutes=25)) == 8
        assert total(base, base + timedelta(microseconds=1)) == 1


@hyp_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 59), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_any_shuffled_duplicated_stream_meters_like_the_clean_one(settings, picks, rng):
    """Property: write the clean stream and a shuffled stream with repeats under two groups;
    both give the same per-customer totals (checked per example on disjoint customers)."""
    tag = f"{rng.random():.12f}"[2:]
    clean = [request_event(i, customer=f"p{tag}-{i % 3}", input_tokens=50 + i, cached=i, output=i % 5,
                           source=f"//prop/{tag}") for i in range(60)]
    noisy = [clean[i] for i in picks] + clean
    rng.shuffle(noisy)
    writer = BatchWriter(dsn(settings), group_id=f"prop-{tag}", max_bytes=65536, future_tolerance_s=300)
    for start in range(0, len(noisy), 17):
        writer.write(_messages(noisy[start:start + 17], start_offset=start))
    writer.close()
    with psycopg.connect(dsn(settings)) as conn:
        got = conn.execute(
            "SELECT customer_id, sum(requests), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens) "
            "FROM request_rollup_hourly WHERE customer_id LIKE %s GROUP BY 1 ORDER BY 1", (f"p{tag}-%",)).fetchall()
    expected = {}
    for i in range(60):
        row = expected.setdefault(f"p{tag}-{i % 3}", [0, 0, 0, 0])
        row[0] += 1
        row[1] += 50 + i
        row[2] += i
        row[3] += i % 5
    assert [(c, *map(int, v)) for c, *v in got] == [(c, *v) for c, v in sorted(expected.items())]
