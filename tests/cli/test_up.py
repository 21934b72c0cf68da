"""`infermeter up`: the whole local stack in the foreground; other commands use it; Ctrl-C stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from infermeter.stack import free_port
from tests.cli.test_cli import run
from tests.metering.conftest import request_event


def test_up_serves_metering_and_the_api_until_ctrl_c(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="infermeter-up-")) / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(port))
    up = subprocess.Popen([sys.executable, "-m", "app.cli", "up"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (home / "stack.json").exists() and time.monotonic() < deadline:
            assert up.poll() is None, up.stderr.read()
            time.sleep(0.2)
        stack = json.loads((home / "stack.json").read_text())
        assert stack["kafka_bootstrap"] and stack["database_url"]

        events = tmp_path / "e.jsonl"
        events.write_bytes(b"\n".join(request_event(i, customer="acme") for i in range(25)) + b"\n")
        ingested = run(["events", "ingest", str(events), "--wait", "--json"], home)
        assert json.loads(ingested.stdout) == {"accepted": 25, "duplicates": 0, "rejected": 0}, ingested.stderr

        url = f"http://127.0.0.1:{port}/v1/usage?from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z"
        for _ in range(100):
            try:
                request = urllib.request.Request(url, headers={"Authorization": "Bearer dev-admin-token"})
                body = json.loads(urllib.request.urlopen(request, timeout=5).read())
                break
            except OSError:
                time.sleep(0.2)
        assert [(r["customer_id"], r["requests"]) for r in body["rows"]] == [("acme", 25)]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    assert up.returncode in (0, 130), up.stderr.read()
    assert not (home / "stack.json").exists()
