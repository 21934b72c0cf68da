"""Usage by project: request events carry the API key's project; the hourly rollups and the period
totals keep it as a dimension ('' for events without one: the "no project" bucket), and a month
grouped by project sums to the ungrouped figures exactly: rollups, totals, `usage --group-by project`
(whole hours and window edges read from raw events)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url
from metering import period_reads, queries
from metering.period_totals import REQUEST_COUNTS, rebuild
from metering.writer import BatchWriter
from tests.cli_in_process import run_cli
from tests.metering.period_checks import Events

NOW = datetime(2026, 12, 1, tzinfo=UTC)
MONTH = queries.Window(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
PROJECTS = (None, "web", "batch")  # None: a key without a project
SUMS = ("requests", "input_tokens", "cached_input_tokens", "output_tokens")


@pytest.fixture
def conn(db_url):
    with psycopg.connect(to_libpq_url(db_url)) as c:
        yield c


def _write(db_url: str) -> list[dict]:
    """120 requests of two customers over two days of November, projects in turn (every third none),
    two models; each batch written, then duplicates of a third of them. The events' data."""
    ev = Events("p")
    lines = []
    start = datetime(2026, 11, 2, 22, 0, tzinfo=UTC)
    for i in range(120):
        at = start + timedelta(minutes=23 * i, microseconds=i)
        lines.append(ev.request(f"cust-{i % 2}", at, model=("m1", "m2")[i % 5 == 0], status=("ok", "error")[i % 7 == 0],
                                input_tokens=100 + i, cached=i % 40, output=i % 13, attempt=1 + (i % 11 == 0),
                                project=PROJECTS[i % 3]))
    writer = BatchWriter(to_libpq_url(db_url), group_id="g", max_bytes=65536, future_tolerance_s=300,
                         clock=lambda: NOW)
    for first in range(0, len(lines), 25):
        writer.write(ev.messages(lines[first:first + 25]))
    assert writer.write(ev.messages(lines[::3])).duplicates == 40
    writer.close()
    return [json.loads(line)["data"] for line in lines]


def _sums(rows: list[dict], *keys: str) -> dict[tuple, tuple[int, ...]]:
    out: dict[tuple, list[int]] = {}
    for r in rows:
        acc = out.setdefault(tuple(r[k] for k in keys), [0] * len(SUMS))
        for n, name in enumerate(SUMS):
            acc[n] += r[name]
    return {k: tuple(v) for k, v in out.items()}


def test_grouped_by_project_sums_to_the_ungrouped_figures_and_events_without_one_still_count(db_url, conn):
    events = _write(db_url)
    without = [e for e in events if "project" not in e]
    assert len(without) == 40

    # the hourly rollups: one row per project, '' for the events without one; their sum is the month
    by_project = dict(conn.execute(
        "SELECT project, sum(requests)::int FROM request_rollup_hourly GROUP BY 1 ORDER BY 1").fetchall())
    assert by_project == {"": 40, "batch": 40, "web": 40}

    # usage over the month, whole hours, and windows whose edges fall inside hours (raw events)
    windows = [MONTH, queries.Window(datetime(2026, 11, 2, 22, 7, tzinfo=UTC), datetime(2026, 11, 4, 3, 31, tzinfo=UTC))]
    for window in windows:
        plain = queries.usage(conn, window, group_by=["model"])
        grouped = queries.usage(conn, window, group_by=["model", "project"])
        assert {r["project"] for r in grouped} == {None, "web", "batch"}
        assert _sums(grouped, "customer_id", "model") == _sums(plain, "customer_id", "model"), window
        inside = [e | {"requests": 1} for e in events
                  if window.start <= datetime.fromisoformat(e["finished_at"].replace("Z", "+00:00")) < window.end]
        assert _sums(grouped, "customer_id", "project") == _sums(
            [e | {"project": e.get("project")} for e in inside], "customer_id", "project"), window
        for project in ("", "web"):  # one project's requests ('' : those without one)
            only = queries.usage(conn, window, group_by=["model"], project=project)
            assert _sums(only, "customer_id", "model") == _sums(
                [r for r in grouped if r["project"] == (project or None)], "customer_id", "model"), (window, project)

    # the period totals (UTC months: no calendar): per project, and summed over projects, equal to the month
    totals = conn.execute(
        f"SELECT customer_id, project, {', '.join(f'sum({c})::bigint' for c in REQUEST_COUNTS)} "
        "FROM request_period_totals WHERE period_start = %s GROUP BY 1, 2 ORDER BY 1, 2", (MONTH.start,)).fetchall()
    grouped = {(r["customer_id"], r["project"] or ""): r for r in queries.usage(conn, MONTH, group_by=["project"])}
    assert {(c, p): (n, i, ci, o) for c, p, n, _ok, _e, _c, _r, i, ci, o, *_ in totals} == {
        k: tuple(r[s] for s in SUMS) for k, r in grouped.items()}
    ungrouped = {r["customer_id"]: tuple(r[s] for s in SUMS) for r in queries.usage(conn, MONTH)}
    for customer, sums in ungrouped.items():
        assert tuple(sum(t[2 + [0, 5, 6, 7][n]] for t in totals if t[0] == customer) for n in range(4)) == sums

    # readers that do not ask for projects give one row per customer x model x deployment x hour, as before
    hourly = list(period_reads.hourly_requests(conn, MONTH.start, MONTH.end))
    assert len(hourly) == len({tuple(r[:4]) for r in hourly})
    assert sum(r[4] for r in hourly) == 120
    rated = {c: rows for c, rows in period_reads.request_sums(conn, MONTH.start, MONTH.end)}
    assert {c: sum(r[3] for r in rows) for c, rows in rated.items()} == {"cust-0": 60, "cust-1": 60}

    # a rebuild keeps the projects (it reads them from the rollups)
    before = conn.execute("SELECT * FROM request_period_totals ORDER BY 1, 2, 3, 4, 5").fetchall()
    for customer in ("cust-0", "cust-1"):
        rebuild(conn, customer)
    conn.commit()
    assert conn.execute("SELECT * FROM request_period_totals ORDER BY 1, 2, 3, 4, 5").fetchall() == before


def test_region_and_project_are_not_combined(conn):
    with pytest.raises(queries.QueryError, match="region and project"):
        queries.parse_group_by("region,project")
    with pytest.raises(queries.QueryError, match="project: not with group_by region"):
        queries.usage(conn, MONTH, group_by=["region"], project="web")


def test_usage_group_by_project_on_the_cli(db_url, monkeypatch, capsys, tmp_path):
    from infermeter.settings import get_settings

    _write(db_url)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    month = ("--from", "2026-11-01T00:00:00Z", "--to", "2026-12-01T00:00:00Z")
    result = run_cli(monkeypatch, capsys, "usage", *month, "--group-by", "project", "--json")
    assert result.code == 0, result.err
    assert [(r["customer_id"], r["project"], r["requests"]) for r in result.json()["rows"]] == [
        ("cust-0", "batch", 20), ("cust-0", "web", 20), ("cust-0", None, 20),
        ("cust-1", "batch", 20), ("cust-1", "web", 20), ("cust-1", None, 20),
    ]
    alone = run_cli(monkeypatch, capsys, "usage", *month, "--project", "", "--json")
    assert [(r["customer_id"], r["requests"]) for r in alone.json()["rows"]] == [("cust-0", 20), ("cust-1", 20)]
    table = run_cli(monkeypatch, capsys, "usage", *month, "--group-by", "project")
    assert table.code == 0 and "project" in table.out and "batch" in table.out
    bad = run_cli(monkeypatch, capsys, "usage", *month, "--group-by", "region,project")
    assert bad.code == 2 and "region and project cannot be combined" in bad.err
