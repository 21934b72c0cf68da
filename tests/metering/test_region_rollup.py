"""Request usage by region: request_region_hourly is written with the other rollups, exactly once,
and `usage --group-by region` answers whole hours from it (events without a region as region None)
and window edges from raw events, to the token."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg

from metering import queries
from metering.kafka_types import Message
from metering.writer import BatchWriter
from tests.metering.conftest import dsn, request_event, subprocess_env

NOW = datetime(2026, 11, 3, tzinfo=UTC)
BASE = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _messages(lines, start_offset=0):
    return [Message("events", 0, start_offset + i, None, line, {}, None) for i, line in enumerate(lines)]


def _stream() -> list[bytes]:
    """90 requests over 3 hours, two customers; every third without a region; some rejected."""
    lines = []
    for i in range(90):
        region = (None, "eu-west", "us-east")[i % 3]
        status = "rejected" if i % 10 == 4 else "ok"
        lines.append(request_event(
            i, customer=f"cust-{i % 2}", at=BASE + timedelta(minutes=2 * i), input_tokens=0 if status == "rejected" else 100 + i,
            cached=0 if status == "rejected" else i % 30, output=0 if status == "rejected" else i % 11, status=status,
            region=region,
        ))  # fmt: skip
    return lines


def _expected(window_start, window_end, lines) -> dict[tuple, tuple[int, int, int, int]]:
    out: dict[tuple, list[int]] = {}
    for line in lines:
        data = json.loads(line)["data"]
        at = datetime.fromisoformat(data["finished_at"].replace("Z", "+00:00"))
        if not window_start <= at < window_end:
            continue
        sums = out.setdefault((data["customer_id"], data.get("region")), [0, 0, 0, 0])
        for n, key in enumerate(("input_tokens", "cached_input_tokens", "output_tokens")):
            sums[n + 1] += data[key]
        sums[0] += 1
    return {key: tuple(value) for key, value in out.items()}


def test_the_region_rollup_is_written_once_and_grouping_by_region_is_exact(settings):
    lines = _stream()
    writer = BatchWriter(dsn(settings), group_id="g1", max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)
    writer.write(_messages(lines[:50]))
    writer.write(_messages(lines[40:], start_offset=50))  # 10 duplicates at new offsets
    writer.write(_messages(lines[:50]))  # a replay: fenced off
    writer.close()
    with psycopg.connect(dsn(settings)) as conn:
        rows = conn.execute(
            "SELECT region, sum(requests), sum(requests_rejected), sum(input_tokens) FROM request_region_hourly "
            "GROUP BY region ORDER BY region"
        ).fetchall()
        with_region = [json.loads(line)["data"] for line in lines if "region" in json.loads(line)["data"]]
        assert rows == [
            (region, len(d := [x for x in with_region if x["region"] == region]),
             sum(x["status"] == "rejected" for x in d), sum(x["input_tokens"] for x in d))
            for region in ("eu-west", "us-east")
        ]
        # whole hours, edges inside an hour, and both
        for start, end in [
            (BASE, BASE + timedelta(hours=3)),
            (BASE + timedelta(minutes=7), BASE + timedelta(minutes=50)),
            (BASE + timedelta(minutes=31), BASE + timedelta(hours=2, minutes=13)),
        ]:
            found = queries.usage(conn, queries.Window(start, end), group_by=["region"])
            got = {(r["customer_id"], r["region"]): (r["requests"], r["input_tokens"], r["cached_input_tokens"],
                                                     r["output_tokens"]) for r in found}
            assert got == _expected(start, end, lines), (start, end)
        # region combines with the other dimensions; one customer only
        by_hour = queries.usage(conn, queries.Window(BASE, BASE + timedelta(hours=3)), customer_id="cust-1",
                                group_by=["region", "hour"])
        assert {r["hour"] for r in by_hour} == {"2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z", "2026-11-02T12:00:00Z"}
        assert {r["region"] for r in by_hour} == {None, "eu-west", "us-east"}
        assert sum(r["requests"] for r in by_hour) == 45


def test_usage_group_by_region_on_the_cli(settings):
    writer = BatchWriter(dsn(settings), group_id="g1", max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)
    writer.write(_messages(_stream()))
    writer.close()
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "usage", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T13:00:00Z",
         "--group-by", "region", "--json"],
        env=subprocess_env(settings), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [(r["customer_id"], r["region"], r["requests"]) for r in rows] == [
        ("cust-0", "eu-west", 15), ("cust-0", "us-east", 15), ("cust-0", None, 15),
        ("cust-1", "eu-west", 15), ("cust-1", "us-east", 15), ("cust-1", None, 15),
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "app.cli", "usage", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T13:00:00Z",
         "--group-by", "continent"],
        env=subprocess_env(settings), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "unknown continent" in bad.stderr and "region" in bad.stderr and "Traceback" not in bad.stderr


def test_reconcile_checks_the_region_rollup(settings):
    from metering.reconcile import reconcile

    writer = BatchWriter(dsn(settings), group_id="g1", max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)
    writer.write(_messages(_stream()))
    writer.close()
    window = queries.Window(BASE, BASE + timedelta(hours=3))
    with psycopg.connect(dsn(settings)) as conn:
        result = reconcile(conn, window)
        assert result.ok and result.totals["region:eu-west:requests"] == 30
        conn.execute("UPDATE request_region_hourly SET output_tokens = output_tokens + 1 "
                     "WHERE customer_id = 'cust-1' AND region = 'us-east' AND hour = %s", (BASE,))
        broken = reconcile(conn, window)
    assert [(d.customer_id, d.meter, d.rollup - d.raw) for d in broken.differences] == [
        ("cust-1", "region:us-east:output_tokens", 1)]
