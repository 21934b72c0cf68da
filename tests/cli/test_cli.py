"""The CLI on a fresh machine: nothing configured, embedded PostgreSQL and broker started on demand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.metering.conftest import request_event, task_event

CLI = [sys.executable, "-m", "app.cli"]


@pytest.fixture(scope="module")
def fresh_home():
    # Outside pytest's 0700 tmp folders: the embedded server runs as its own system user.
    return Path(tempfile.mkdtemp(prefix="infermeter-cli-")) / "home"


def run(args, home, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env["INFERMETER_HOME"] = str(home)
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=timeout)


def test_ingest_wait_then_usage_just_works_on_a_fresh_machine(fresh_home, tmp_path):
    from datetime import UTC, datetime, timedelta

    base = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join([
        request_event(1, customer="acme", at=base, input_tokens=1000, cached=512, output=20, task_id="t1"),
        b"this line is not json",
        request_event(2, customer="acme", model="m2", at=base + timedelta(minutes=5), input_tokens=10, cached=0, output=2),
        task_event("t1", "acme", "succeeded", base + timedelta(minutes=1)),
    ]) + b"\n")
    first = run(["events", "ingest", str(events), "--wait", "--json"], fresh_home)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"accepted": 3, "duplicates": 0, "rejected": 1}
    assert f"{events}:2: rejected: not valid JSON" in first.stderr

    again = run(["events", "ingest", str(events), "--wait", "--json"], fresh_home)
    assert json.loads(again.stdout) == {"accepted": 0, "duplicates": 3, "rejected": 1}
    assert again.returncode == 0, again.stderr  # every event is metered (by the first run)

    usage = run(["usage", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-03T00:00:00Z",
                 "--group-by", "model", "--json"], fresh_home)
    assert usage.returncode == 0, usage.stderr
    assert json.loads(usage.stdout) == {"rows": [
        {"customer_id": "acme", "model": "m1", "requests": 1, "input_tokens": 1000, "cached_input_tokens": 512,
         "uncached_input_tokens": 488, "output_tokens": 20},
        {"customer_id": "acme", "model": "m2", "requests": 1, "input_tokens": 10, "cached_input_tokens": 0,
         "uncached_input_tokens": 10, "output_tokens": 2},
    ]}
    tasks = run(["tasks", "--customer", "acme", "--json"], fresh_home)
    [task] = json.loads(tasks.stdout)["tasks"]
    assert (task["task_id"], task["attempts"], task["input_tokens"], task["outcome"]) == ("t1", 1, 1000, "succeeded")
    reconcile = run(["reconcile", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-03T00:00:00Z"], fresh_home)
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr
    assert "reconcile ok" in reconcile.stdout


def test_ingest_wait_exits_1_when_no_event_of_the_file_is_metered(fresh_home, tmp_path):
    from datetime import UTC, datetime

    negative = json.loads(request_event(900, customer="acme", at=datetime(2026, 11, 2, 11, tzinfo=UTC), output=-3))
    events = tmp_path / "all-bad.jsonl"
    events.write_bytes(b"this line is not json\n" + json.dumps(negative).encode() + b"\n")
    result = run(["events", "ingest", str(events), "--wait", "--json"], fresh_home)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout) == {"accepted": 0, "duplicates": 0, "rejected": 2}
    assert result.stderr.strip().splitlines()[-1] == (
        "error: no event of the file was metered (2 rejected): see the lines above and "
        "`infermeter events dead-letters`")
    assert "Traceback" not in result.stderr

    help_text = run(["events", "ingest", "--help"], fresh_home)
    assert help_text.returncode == 0
    assert "Exit status 1 when no event of the file is metered" in " ".join(help_text.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["events", "ingest", "/nonexistent/file.jsonl"], "no such file"),
    (["usage", "--from", "yesterday", "--to", "2026-11-03T00:00:00Z"], "not an ISO 8601 time"),
    (["usage", "--from", "2026-11-02T00:00:00", "--to", "2026-11-03T00:00:00Z"], "has no time zone"),
    (["usage", "--from", "2026-11-03T00:00:00Z", "--to", "2026-11-02T00:00:00Z"], "to must be after from"),
    (["usage", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-03T00:00:00Z", "--group-by", "colour"],
     "unknown colour"),
    (["reconcile", "--from", "2026-11-02T00:30:00Z", "--to", "2026-11-03T00:00:00Z"], "whole hours"),
])
def test_bad_input_gets_one_clear_line_and_no_traceback(fresh_home, args, message):
    result = run(args, fresh_home)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def _commands(group, prefix=()):
    for name, command in group.commands.items():
        yield prefix + (name,)
        if hasattr(command, "commands"):
            yield from _commands(command, prefix + (name,))


def test_every_command_has_help():
    import typer.main

    from app import cli

    cli._mount_optional_apps()
    root = typer.main.get_command(cli.app)
    paths = list(_commands(root))
    assert ("events", "ingest") in paths and ("demo",) in paths and ("pricing", "compare") in paths
    from typer.testing import CliRunner

    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli.app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output
