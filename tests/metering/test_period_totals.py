"""Period totals kept at ingest equal what each billing period reads today (hourly rollups + edge
hours from raw events; tasks at outcome time), in customers' own periods: +05:30, +05:45, a DST
change, anchor day 31 in February, UTC months without a calendar; under late, duplicated and
replaced events; after a calendar change; after a consumer killed mid-transaction."""

from __future__ import annotations

import os
import signal
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from billing.periods import billing_period
from infermeter.stack.postgres import to_libpq_url
from metering.calendars import CalendarError, calendar_of, set_calendar
from metering.period_totals import rebuild
from metering.writer import BatchWriter
from tests.metering.conftest import dsn, publish, safe_receipt, snapshot, start_consumer_process, wait_until
from tests.metering.period_checks import Events, check_customer, give_calendar, kept, totals_snapshot

NOW = datetime(2026, 6, 1, tzinfo=UTC)  # the writer's clock: every event below is in the past
US = timedelta(microseconds=1)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)

SCHEDULES = {
    "kol": ("Asia/Kolkata", 1),  # +05:30: periods start at 18:30 UTC
    "ktm": ("Asia/Kathmandu", 15),  # +05:45: at 18:15 UTC
    "nyc": ("America/New_York", 1),  # the March period holds the change to daylight time (743 h)
    "feb": ("Europe/Berlin", 31),  # anchor 31: the 2026-02 period starts on Feb 28 local
}


def writer_for(url: str, group: str = "g") -> BatchWriter:
    return BatchWriter(to_libpq_url(url), group_id=group, max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)


def stop_process(process) -> None:
    if process.poll() is None:
        process.terminate()
    process.wait(30)


@pytest.fixture
def conn(db_url):
    with psycopg.connect(to_libpq_url(db_url)) as c:
        yield c


def boundary(customer: str, label: str) -> datetime:
    timezone, anchor_day = SCHEDULES.get(customer, ("UTC", 1))
    return billing_period(label, timezone, anchor_day).start


def scenario(ev: Events, customer: str, b: datetime | None = None) -> tuple[list[bytes], list[bytes]]:
    """Events around the customer's 2026-03 period start B (`b` when given): (first batch, late batch)."""
    b = boundary(customer, "2026-03") if b is None else b
    c = customer
    first = [
        ev.request(c, b - 40 * MIN, input_tokens=1000, cached=400, output=50, project="web"),
        ev.request(c, b - US, model="m2", deployment="d2", status="error", input_tokens=7, output=0),
        ev.request(c, b, cached=60, status="cancelled"),
        ev.request(c, b + 29 * MIN, input_tokens=300, cached=300, output=3, attempt=2, status="rejected",
                   project="batch"),
        ev.request(c, b + 3 * HOUR, model="m2", deployment="d2", input_tokens=5000, cached=4096, output=900),
        ev.request(c, b - 20 * 24 * HOUR, output=1),  # mid-period, a whole hour
        # t1: two attempts, succeeded 1 us before the boundary
        ev.request(c, b - 2 * HOUR, task_id=f"{c}-t1", attempt=1),
        ev.request(c, b - HOUR, task_id=f"{c}-t1", attempt=2, cached=99),
        ev.task(c, f"{c}-t1", "succeeded", b - US),
        # t2: failed just after the boundary (later replaced by a success in April)
        ev.request(c, b - 5 * MIN, task_id=f"{c}-t2"),
        ev.task(c, f"{c}-t2", "failed", b + MIN),
        # t3: abandoned with two attempts (its attempts are not counted)
        ev.request(c, b - 3 * HOUR, task_id=f"{c}-t3", attempt=1),
        ev.request(c, b - 3 * HOUR + MIN, task_id=f"{c}-t3", attempt=2),
        ev.task(c, f"{c}-t3", "abandoned", b + 2 * MIN),
        # t4: succeeded; a third attempt is reported after the outcome (late batch)
        ev.request(c, b + 10 * MIN, task_id=f"{c}-t4", attempt=1),
        ev.task(c, f"{c}-t4", "succeeded", b + 20 * MIN),
        # t5: failed, then a report with an EARLIER finished_at arrives late: the later one stays
        ev.task(c, f"{c}-t5", "failed", b + 4 * HOUR),
        ev.usage(c, "tool_calls", "2.5", b - US),
        ev.usage(c, "tool_calls", "0.000000000001", b),
        ev.usage(c, "verifier_s", "12", b + 30 * MIN),
        ev.replica(c, b - 90 * MIN, b + 45 * MIN, gpus=2),  # dedicated: slices of three hours
        ev.replica(None, b - 30 * MIN, b + 30 * MIN, deployment="pool-1"),  # the shared pool: not in the totals
    ]
    late = [
        ev.request(c, b - 45 * 24 * HOUR, input_tokens=11, output=2),  # a backfill two periods back
        ev.request(c, b - 10 * MIN, status="error", attempt=3, input_tokens=40, cached=8, output=4, project="web"),
        ev.request(c, b + 11 * MIN, task_id=f"{c}-t4", attempt=3),  # t4's third attempt, after its outcome
        ev.request(c, b + 12 * MIN, task_id=f"{c}-t4", attempt=3),  # same attempt again: still three attempts
        ev.task(c, f"{c}-t2", "succeeded", b + 32 * 24 * HOUR, source="//test/verifier"),  # moves t2 to April
        ev.task(c, f"{c}-t5", "succeeded", b + 3 * HOUR, source="//test/verifier"),  # earlier: t5 stays failed
        ev.usage(c, "tool_calls", "1", b - 30 * MIN),
        ev.replica(c, b + 2 * HOUR, b + 2 * HOUR + 30 * MIN),
    ]
    return first, late


CUSTOMERS = [*SCHEDULES, "plain"]


def test_totals_equal_what_each_period_reads_under_late_duplicated_and_replaced_events(db_url, conn):
    for customer, (timezone, anchor_day) in SCHEDULES.items():
        assert give_calendar(conn, customer, timezone, anchor_day).periods_added == 1572
    ev = Events("s")
    batches = [scenario(ev, c) for c in CUSTOMERS]
    writer = writer_for(db_url)
    first = [line for f, _ in batches for line in f]
    late = [line for _, late in batches for line in late]
    assert writer.write(ev.messages(first)).accepted == len(first)
    late_messages = ev.messages(late)
    assert writer.write(late_messages).accepted == len(late)
    before = totals_snapshot(conn)
    # a replay of the late batch (same offsets: fenced) and duplicates of everything at new offsets
    assert writer.write(late_messages).skipped == len(late)
    assert writer.write(ev.messages(first[::2] + late)).duplicates == len(first[::2]) + len(late)
    writer.close()
    assert totals_snapshot(conn) == before

    compared = {c: check_customer(conn, c, SCHEDULES.get(c, ("UTC", 1))) for c in CUSTOMERS}
    assert all(n >= 3 for n in compared.values()), compared

    # A few figures by hand, Asia/Kolkata: the 2026-03 period starts 2026-02-28 18:30 UTC.
    march = boundary("kol", "2026-03")
    assert march == datetime(2026, 2, 28, 18, 30, tzinfo=UTC)
    feb = kept(conn, "kol", boundary("kol", "2026-02"))
    mar = kept(conn, "kol", march)
    # (succeeded, failed, abandoned, attempts of the succeeded, of the failed): February has t1 and its
    # two attempts; March t4 (attempts 1 and 3: two), t5 (failed, the earlier success did not replace it)
    # and t3 (abandoned, attempts not counted); t2 moved from March (failed) to April (succeeded)
    assert feb["tasks"] == {"": (1, 0, 0, 2, 0)}
    assert mar["tasks"] == {"": (1, 1, 1, 2, 0)}
    assert kept(conn, "kol", boundary("kol", "2026-04"))["tasks"] == {"": (1, 0, 0, 1, 0)}  # t2, moved
    # requests of m1/d1 in February: b-40min, b-2h, b-1h, b-5min, b-3h, b-3h+1min, b-10min (late), b-20 days
    assert feb["requests"][("m1", "d1")][:2] == (8, 7)
    # the GPU slice of the hour 18:00-19:00 UTC counts in February (the hour starts before 18:30)
    assert feb["gpu"] == {("dedicated-1", "H100"): ((60 + 60) * 60_000 * 2,)}
    assert mar["gpu"] == {("dedicated-1", "H100"): (15 * 60_000 * 2 + 30 * 60_000,)}
    assert feb["usage"]["tool_calls"] == (Decimal("3.5"), 2)


def test_a_customer_without_a_calendar_is_kept_by_utc_month_and_rebuilt_when_it_gets_one(db_url, conn):
    ev = Events("c")
    first, late = scenario(ev, "later")  # 'later' has no calendar: B is 2026-03-01 00:00 UTC
    writer = writer_for(db_url)
    writer.write(ev.messages(first + late))
    assert calendar_of(conn, "later") == ("UTC", 1)
    assert check_customer(conn, "later") >= 3
    assert {s for (s,) in conn.execute("SELECT DISTINCT period_start FROM request_period_totals")} == {
        datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)}

    change = give_calendar(conn, "later", "Asia/Kathmandu", 15)
    assert change.changed and change.rebuilt is not None and change.rebuilt.rows > 0
    check_customer(conn, "later", ("Asia/Kathmandu", 15))
    rebuilt = totals_snapshot(conn)

    # ingest goes on under the new calendar, and a rebuild from scratch gives what ingest keeps
    more = [ev.request("later", datetime(2026, 3, 14, 18, 15, tzinfo=UTC) - US, output=3),
            ev.request("later", datetime(2026, 3, 14, 18, 15, tzinfo=UTC), output=4),
            ev.task("later", "later-t1", "failed", datetime(2026, 3, 14, 18, 20, tzinfo=UTC))]
    writer.write(ev.messages(more))
    check_customer(conn, "later", ("Asia/Kathmandu", 15))
    kept_by_ingest = totals_snapshot(conn)
    assert kept_by_ingest != rebuilt
    result = rebuild(conn, "later")
    conn.commit()
    assert totals_snapshot(conn) == kept_by_ingest
    assert result.rows == sum(len(v) for k, v in kept_by_ingest.items() if k != "task_outcomes")

    # setting the same calendar again changes nothing and rebuilds nothing; back to UTC months rebuilds
    assert give_calendar(conn, "later", "Asia/Kathmandu", 15).rebuilt is None
    back = set_calendar(conn, "later", "UTC", 1, ())
    conn.commit()
    assert back.changed and back.periods_added == 0 and back.rebuilt is not None
    check_customer(conn, "later")
    writer.close()


def test_set_calendar_refuses_what_it_cannot_keep(conn):
    with pytest.raises(CalendarError, match="anchor day 0"):
        set_calendar(conn, "c", "Asia/Kolkata", 0, ())
    with pytest.raises(CalendarError, match="is new to metering: give its periods"):
        set_calendar(conn, "c", "Asia/Kolkata", 1, ())
    conn.rollback()
    one = billing_period("2026-03", "Asia/Kolkata", 1)
    with pytest.raises(CalendarError, match="give those labelled 1970-01 to 2100-12"):
        set_calendar(conn, "c", "Asia/Kolkata", 1, [(one.start, one.end)])
    conn.rollback()
    two = billing_period("2026-05", "Asia/Kolkata", 1)
    with pytest.raises(CalendarError, match="periods must tile time"):
        set_calendar(conn, "c", "Asia/Kolkata", 1, [(one.start, one.end), (two.start, two.end)])
    conn.rollback()
    with pytest.raises(CalendarError, match="aware datetimes"):
        set_calendar(conn, "c", "Asia/Kolkata", 1, [(one.start.replace(tzinfo=None), one.end)])
    conn.rollback()


def test_rebuilding_a_customer_metering_never_saw_writes_nothing(conn):
    result = rebuild(conn, "nobody")
    assert (result.rows, result.as_dict()["request_rows"]) == (0, 0)


# --- property: any event set, order and duplication -------------------------------------------

_BOUNDARIES = [boundary(c, label) for c in SCHEDULES for label in ("2026-02", "2026-03")] + [
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),  # New York springs forward
    datetime(2026, 3, 1, tzinfo=UTC),
]
_instant = st.builds(lambda b, us: b + timedelta(microseconds=us), st.sampled_from(_BOUNDARIES),
                     st.integers(-2 * 3600 * 10**6, 2 * 3600 * 10**6) | st.sampled_from([-1, 0, 1]))
_event = st.one_of(
    st.tuples(st.just("request"), st.sampled_from(CUSTOMERS), _instant, st.sampled_from(["ok", "error", "rejected"]),
              st.integers(0, 500), st.integers(0, 3), st.sampled_from([None, "t1", "t2"]),
              st.sampled_from([None, "web", "batch"])),
    st.tuples(st.just("task"), st.sampled_from(CUSTOMERS), _instant,
              st.sampled_from(["succeeded", "failed", "abandoned"]), st.sampled_from(["t1", "t2"]),
              st.sampled_from(["//a", "//b"])),
    st.tuples(st.just("usage"), st.sampled_from(CUSTOMERS), _instant, st.sampled_from(["0.5", "3", "0.000000000001"])),
    st.tuples(st.just("gpu"), st.sampled_from(CUSTOMERS), _instant, st.integers(1, 150)),
)


@hyp_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(events=st.lists(_event, min_size=1, max_size=40), data=st.data())
def test_any_events_in_any_order_with_duplicates_keep_exact_period_totals(db_url, conn, events, data):
    tag = uuid.uuid4().hex[:8]
    ev = Events(tag)
    customer = {c: f"{c}-{tag}" for c in CUSTOMERS}
    for c, (timezone, anchor_day) in SCHEDULES.items():
        give_calendar(conn, customer[c], timezone, anchor_day)
    lines = []
    for kind, c, at, *rest in events:
        who = customer[c]
        if kind == "request":
            status, tokens, attempt, task, project = rest
            lines.append(ev.request(who, at, status=status, input_tokens=tokens, cached=tokens // 3, output=tokens % 7,
                                    attempt=attempt + 1, task_id=task and f"{who}-{task}", project=project))
        elif kind == "task":
            outcome, task, source = rest
            lines.append(ev.task(who, f"{who}-{task}", outcome, at, source=source))
        elif kind == "usage":
            lines.append(ev.usage(who, "tool_calls", rest[0], at))
        else:
            lines.append(ev.replica(who, at, at + timedelta(minutes=rest[0])))
    noisy = lines + data.draw(st.lists(st.sampled_from(lines), max_size=10), label="duplicates")
    noisy = data.draw(st.permutations(noisy), label="order")
    size = data.draw(st.integers(1, 12), label="batch size")
    writer = writer_for(db_url, group=f"p-{tag}")
    for start in range(0, len(noisy), size):
        writer.write(ev.messages(noisy[start:start + size]))
    writer.close()
    for c in CUSTOMERS:
        check_customer(conn, customer[c], SCHEDULES.get(c, ("UTC", 1)))


# --- a consumer killed between the rollup write and the commit ---------------------------------


WAITING = "%INSERT INTO ingest_receipts%"  # the writer's receipt upsert, after its batch statement


@pytest.mark.slow
def test_kill_9_between_the_totals_write_and_the_commit_counts_nothing_twice(settings):
    """The test holds the ingest receipt row locked, so the consumer's transaction stops at its receipt
    upsert: after the batch's statement (events, rollups and period totals written) and the task
    statement, before the commit. It is killed there; a new consumer writes everything exactly once."""
    with psycopg.connect(dsn(settings)) as conn:
        for c, (timezone, anchor_day) in SCHEDULES.items():
            give_calendar(conn, c, timezone, anchor_day)
    ev = Events("k")
    lines = [line for c in CUSTOMERS for batch in scenario(ev, c) for line in batch]
    ingest_id = uuid.uuid4().hex
    blocker = psycopg.connect(dsn(settings))
    blocker.execute("INSERT INTO ingest_receipts (ingest_id) VALUES (%s)", (ingest_id,))
    blocker.commit()
    blocker.execute("SELECT * FROM ingest_receipts WHERE ingest_id = %s FOR UPDATE", (ingest_id,))
    publication = publish(settings, lines, ingest_id=ingest_id)
    assert publication.published == len(lines)
    victim = start_consumer_process(settings)
    try:
        with psycopg.connect(dsn(settings), autocommit=True) as watch:
            def waiting_on_receipt() -> bool:
                return bool(watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s", (WAITING,)
                ).fetchone())

            wait_until(waiting_on_receipt, 120, "the consumer to wait at its receipt, before its commit")
            # that transaction has written the rollups and the totals (it holds their tables' write lock),
            # not committed: nobody else sees them
            written = watch.execute(
                "SELECT DISTINCT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE a.query LIKE %s AND l.mode = 'RowExclusiveLock'",
                (WAITING,)).fetchall()
            assert {"request_rollup_hourly", "request_period_totals", "task_period_totals", "usage_period_totals",
                    "gpu_period_totals"} <= {name for (name,) in written}
            assert watch.execute("SELECT count(*) FROM request_period_totals").fetchone() == (0,)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
    finally:
        stop_process(victim)
    blocker.rollback()  # the killed backend goes on, finds its client gone and rolls back
    blocker.close()
    with psycopg.connect(dsn(settings), autocommit=True) as conn:  # pg_stat_activity is read once per transaction
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s",
                                        (WAITING,)).fetchone() == (0,), 30, "the killed consumer's backends to end")
        assert conn.execute("SELECT count(*) FROM raw_events").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM request_period_totals").fetchone() == (0,)
    survivor = start_consumer_process(settings)
    try:
        wait_until(lambda: safe_receipt(settings, ingest_id).total >= len(lines), 120, "every event metered")
    finally:
        stop_process(survivor)
    counts = safe_receipt(settings, ingest_id)
    assert (counts.accepted, counts.duplicates, counts.rejected) == (len(lines), 0, 0)
    with psycopg.connect(dsn(settings)) as conn:
        for c in CUSTOMERS:
            check_customer(conn, c, SCHEDULES.get(c, ("UTC", 1)))
        once = totals_snapshot(conn)
    rollups = snapshot(settings)
    # the same events again: all duplicates, nothing moves
    repeat = publish(settings, lines)
    again = start_consumer_process(settings)
    try:
        wait_until(lambda: safe_receipt(settings, repeat.ingest_id).total >= len(lines), 120, "the repeat metered")
    finally:
        stop_process(again)
    assert safe_receipt(settings, repeat.ingest_id).duplicates == len(lines)
    with psycopg.connect(dsn(settings)) as conn:
        assert totals_snapshot(conn) == once
    assert snapshot(settings) == rollups


# --- `infermeter metering rebuild-totals` --------------------------------------------------------


def rebuild_cli(db_url: str, *args: str):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    env["DATABASE_URL"] = db_url
    return subprocess.run([sys.executable, "-m", "app.cli", "metering", "rebuild-totals", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_rebuild_totals_command_restores_lost_totals_and_says_what_it_did(db_url, conn):
    import json

    give_calendar(conn, "kol", *SCHEDULES["kol"])
    ev = Events("cli")
    first, late = scenario(ev, "kol")
    other_first, other_late = scenario(ev, "plain")
    writer = writer_for(db_url)
    writer.write(ev.messages(first + late + other_first + other_late))
    writer.close()
    kept_by_ingest = totals_snapshot(conn)
    for table in ("request_period_totals", "usage_period_totals", "task_period_totals", "gpu_period_totals"):
        conn.execute(f"DELETE FROM {table}")
    conn.execute("UPDATE task_outcomes SET counted_period = NULL, counted_outcome = NULL, counted_attempts = 0")
    conn.commit()

    one = rebuild_cli(db_url, "--customer", "kol", "--customer", "nobody", "--json")
    assert one.returncode == 0, one.stderr
    report = json.loads(one.stdout)
    assert [c["customer_id"] for c in report["customers"]] == ["kol", "nobody"]
    assert report["customers"][1] == {"customer_id": "nobody", "request_rows": 0, "usage_rows": 0, "task_rows": 0,
                                      "gpu_rows": 0}
    assert report["rows"] == sum(row[0] == "kol" for table, rows in kept_by_ingest.items() if table != "task_outcomes"
                                 for row in rows) > 0
    check_customer(conn, "kol", SCHEDULES["kol"])

    every = rebuild_cli(db_url, "--all")
    assert every.returncode == 0, every.stderr
    assert "period totals rebuilt: 2 customers" in every.stdout
    assert totals_snapshot(conn) == kept_by_ingest

    for args, message in (((), "name the customers to rebuild with --customer C"),
                          (("--all", "--customer", "kol"), "name the customers to rebuild with --customer C")):
        refused = rebuild_cli(db_url, *args)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [f"error: {message} (repeatable), or give --all"]


def test_one_customers_task_events_on_two_partitions_written_concurrently_stay_exact(db_url, conn):
    """Producers key events by customer, but the totals must not depend on it: two writers (two
    partitions) write attempts and outcomes of the same tasks at the same time."""
    import threading

    from metering.kafka_types import Message

    give_calendar(conn, "kol", *SCHEDULES["kol"])
    b = boundary("kol", "2026-03")
    ev = Events("two")
    tasks = [f"kol-c{t}" for t in range(60)]
    outcomes = [ev.task("kol", task, ("succeeded", "failed", "abandoned")[n % 3], b + (-1) ** n * MIN * (n + 1))
                for n, task in enumerate(tasks)]
    writer = writer_for(db_url, group="two")
    writer.write(ev.messages(outcomes))  # partition 0, offsets from 0
    writer.close()
    # then rounds of attempts only (nothing in the batch's statement waits for the other writer), and
    # every other round a replacing outcome for a third of the tasks
    rounds: list[list[list[bytes]]] = [[], []]
    for r in range(10):
        for side in (0, 1):
            # each side its own model: no rollup row is shared, so nothing else orders the two transactions
            batch = [ev.request("kol", b - MIN * (r + 1), model=f"m{side}", task_id=task, attempt=2 + 2 * r + side)
                     for task in tasks]
            if r % 2 and side:
                batch += [ev.task("kol", task, ("succeeded", "failed")[r % 4 // 2], b + HOUR * (r + 1) * (-1) ** n,
                                  source=f"//later/{r}") for n, task in enumerate(tasks) if n % 3 == 0]
            rounds[side].append(batch)
    writers = [writer_for(db_url, group="two"), writer_for(db_url, group="two")]
    start = threading.Barrier(2)
    errors = []

    def run(side: int) -> None:
        try:
            for r, batch in enumerate(rounds[side]):
                messages = [Message("events", 2 + side, r * 1000 + i, None, line, {}, None) for i, line in enumerate(batch)]
                start.wait(30)
                writers[side].write(messages)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(side,)) for side in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for writer in writers:
        writer.close()
    assert not errors, errors
    check_customer(conn, "kol", SCHEDULES["kol"])


def test_a_rebuild_counts_a_split_hour_of_an_archived_month_whole_in_the_period_of_its_start(db_url, conn):
    """Once a month's raw events are archived, nothing can split its hours again: a rebuild then counts
    such an hour, like a GPU slice, in the period that contains the hour's start; nothing is lost."""
    give_calendar(conn, "kol", *SCHEDULES["kol"])
    b = boundary("kol", "2026-03")  # 2026-02-28 18:30 UTC
    ev = Events("arc")
    writer = writer_for(db_url)
    writer.write(ev.messages([ev.request("kol", b - 20 * MIN, output=1), ev.request("kol", b + 20 * MIN, output=2),
                              ev.request("kol", b - 3 * HOUR, output=4)]))
    writer.close()
    feb, mar = boundary("kol", "2026-02"), b

    def outputs() -> tuple[int, int]:
        return tuple(kept(conn, "kol", start)["requests"].get(("m1", "d1"), (0,) * 12)[7] for start in (feb, mar))

    assert outputs() == (5, 2)
    conn.execute("INSERT INTO archived_months (month, file, events, key_checksum) "
                 "VALUES ('2026-02-01T00:00:00Z', 'raw_events_2026_02.parquet', 3, '0')")
    conn.execute("DROP TABLE raw_events_2026_02")
    conn.commit()
    rebuild(conn, "kol")
    conn.commit()
    assert outputs() == (7, 0)
