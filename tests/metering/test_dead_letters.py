"""Bad events are dead-lettered with a clear reason; valid events of the same batch all land."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg

from metering.kafka import make_assigned_consumer
from metering.kafka_types import TopicPartition
from tests.metering.conftest import dsn, meter, request_event, task_event

BASE = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _bad(**changes) -> bytes:
    event = json.loads(request_event(900, at=BASE))
    data_changes = changes.pop("data", {})
    event.update(changes)
    event["data"].update(data_changes)
    for key in [k for k, v in changes.items() if v is None]:
        del event[key]
    return json.dumps(event).encode()


def _task_finished_elsewhere() -> bytes:
    """A task outcome whose envelope time (an hour later) is not when the task finished."""
    event = json.loads(task_event("task-x", "cust-1", "succeeded", BASE))
    event["id"] = "mismatch"
    event["time"] = (BASE + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    return json.dumps(event).encode()


def test_each_kind_of_bad_event_is_dead_lettered_and_the_rest_of_the_batch_lands(settings):
    future = datetime.now(UTC) + timedelta(hours=1)
    not_json = b'{"specversion": "1.0", "id": "x", '
    bad = {
        "invalid_data": _bad(id="wrong-types", data={"input_tokens": "100"}),
        "invalid_data-negative": _bad(id="negative", data={"output_tokens": -1}),
        "cached_exceeds_input": _bad(id="cached", data={"cached_input_tokens": 101, "input_tokens": 100}),
        "unknown_type": _bad(id="unknown", type="infermeter.request.v7"),
        "invalid_envelope": _bad(id=None),
        "future_time": _bad(id="future", time=future.isoformat().replace("+00:00", "Z")),
        "too_large": _bad(id="huge", data={"tags": {"pad": "x" * 1_000_000}}),
        "time_mismatch": _task_finished_elsewhere(),
    }
    good = [request_event(i, at=BASE + timedelta(seconds=i)) for i in range(30)]
    lines = good[:10] + list(bad.values()) + good[10:]
    counts = meter(settings, lines, raw=[not_json])  # `events ingest` would refuse the non-JSON line itself
    bad["invalid_json"] = not_json
    assert (counts.accepted, counts.duplicates, counts.rejected) == (30, 0, len(bad))

    with psycopg.connect(dsn(settings)) as conn:
        rows = conn.execute(
            "SELECT reason, detail, event_id, octet_length(payload) FROM dead_letters ORDER BY \"offset\"").fetchall()
        requests = conn.execute("SELECT sum(requests), sum(output_tokens) FROM request_rollup_hourly").fetchone()
    assert requests == (30, 300)
    reasons = [r[0] for r in rows]
    assert sorted(reasons) == sorted(k.split("-")[0] for k in bad)
    by_id = {r[2]: r for r in rows}
    assert "input_tokens" in by_id["wrong-types"][1] and "Expected `int`" in by_id["wrong-types"][1]
    assert ">= 0" in by_id["negative"][1]
    assert "101 > input_tokens 100" in by_id["cached"][1]
    assert "infermeter.request.v7" in by_id["unknown"][1]
    assert "more than 300 s" in by_id["future"][1]
    assert "must equal data.finished_at" in by_id["mismatch"][1]
    assert "limit is 65536" in by_id["huge"][1] and by_id["huge"][3] > 1_000_000  # raw payload kept whole
    missing_id = [r for r in rows if r[0] == "invalid_envelope"][0]
    assert "`id`" in missing_id[1]

    # ... and a copy of each went to the dead-letter topic with its reason in a header.
    consumer = make_assigned_consumer(settings.kafka_bootstrap, offsets={TopicPartition(settings.dead_letter_topic, 0): 0})
    seen = []
    for _ in range(50):
        seen += consumer.poll_batch(100, 0.2)
        if len(seen) >= len(bad):
            break
    consumer.close()
    assert sorted(m.headers["infermeter-dead-letter-reason"].decode() for m in seen) == sorted(reasons)


def test_an_event_postgres_refuses_is_isolated_and_dead_lettered(settings):
    """Two maximal quantities on one rollup row overflow NUMERIC(38, 12): the second event is found
    by halving the batch and dead-lettered as storage_error; everything else lands."""
    from tests.metering.conftest import usage_event

    huge = "9" * 26 + "." + "9" * 12
    lines = [request_event(i, at=BASE + timedelta(seconds=i)) for i in range(6)]
    lines[2:2] = [usage_event(1, "cust-a", "tool_calls", huge, BASE), usage_event(2, "cust-a", "tool_calls", huge, BASE)]
    counts = meter(settings, lines)
    assert (counts.accepted, counts.duplicates, counts.rejected) == (7, 0, 1)
    with psycopg.connect(dsn(settings)) as conn:
        assert conn.execute("SELECT sum(requests) FROM request_rollup_hourly").fetchone()[0] == 6
        assert str(conn.execute("SELECT quantity FROM usage_rollup_hourly").fetchone()[0]) == huge
        reason, detail = conn.execute("SELECT reason, detail FROM dead_letters").fetchone()
    assert reason == "storage_error" and "overflow" in detail


def test_writer_threads_copying_dead_letters_at_once_share_one_producer(settings):
    """Each writer thread copies its batch's dead letters; two creating the producer at once used to
    leave one producer unreferenced, and its queued copies were dropped with it (seen in CI)."""
    import threading
    import time

    from metering.consumer import MeteringConsumer
    from metering.kafka import make_producer

    made = []

    def slow_make_producer():
        time.sleep(0.05)  # a real client takes a moment to build: the window the race needs
        made.append(make_producer(settings.kafka_bootstrap, settings.kafka_backend, client_id="infermeter-dead-letter"))
        return made[-1]

    metering = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap,
                                dead_letter_producer=slow_make_producer)
    start = threading.Barrier(4)

    def copy() -> None:
        start.wait()
        metering._publish_dead_letters([])

    threads = [threading.Thread(target=copy) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert len(made) == 1
        assert metering._dlq is made[0]
    finally:
        metering.close()
