"""`infermeter up --serving --replicas 2`: the whole serving stack from one command, end to end.

One test, all real: `up` runs as a subprocess on a home of its own (embedded PostgreSQL, Tansu,
metering, the API) and starts two vLLM CPU replicas of the session's tiny model (`--model`, so the
model is not built twice), a replica agent each and the gateway. The test reads the base URL and
the key `up` prints, sends a chat completion through the official OpenAI client, finds its event
in metering's `raw_events` (and the agents' intervals of both replicas), then sends SIGTERM and
checks that every process `up` started is gone (the process table, read from /proc).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from openai import OpenAI

from infermeter.stack import free_port, is_recorded_process, process_start, to_libpq_url
from tests.cli.test_up import _left_behind, _processes


def _descendants(pid: int) -> set[int]:
    table = _processes()
    found = {pid}
    grew = True
    while grew:
        children = {p for p, (ppid, _, _) in table.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found - {pid}


def _printed(out_path: Path, up: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    """OPENAI_BASE_URL and OPENAI_API_KEY, once `up` printed them."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = out_path.read_text(errors="replace")
        url = re.search(r"^OPENAI_BASE_URL=(\S+)$", text, re.M)
        key = re.search(r"^OPENAI_API_KEY=(\S+)$", text, re.M)
        if url and key:
            return url.group(1), key.group(1)
        assert up.poll() is None, f"up exited with {up.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"up printed no URL and key in {timeout_s:.0f} s:\n{text}"
        time.sleep(0.5)


def _rows(database_url: str, sql: str, params: tuple) -> list[tuple]:
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        return conn.execute(sql, params).fetchall()


def _wait_rows(database_url: str, sql: str, params: tuple, enough, timeout_s: float = 60.0) -> list[tuple]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _rows(database_url, sql, params)
        if enough(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def test_up_serving_two_replicas_meters_a_chat_completion_and_leaves_nothing_behind(
    tiny_model: Path, vllm_python: str
):
    # Outside pytest's 0700 tmp folders: the embedded server runs as its own system user.
    home = Path(tempfile.mkdtemp(prefix="infermeter-up-serving-")) / "home"
    home.mkdir(parents=True)
    customer = f"up-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(
        INFERMETER_HOME=str(home),
        INFERMETER_API_PORT=str(free_port()),
        INFERMETER_GATEWAY_PORT=str(free_port()),
        INFERMETER_VLLM_PYTHON=vllm_python,
        INFERMETER_REPLICA_INTERVAL_S="2",  # the agents' intervals land within the test
        INFERMETER_REPLICA_SAMPLE_S="0.5",
    )
    out_path = home / "up.out"
    with open(out_path, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "up", "--serving", "--replicas", "2", "--model", str(tiny_model),
             "--customer", customer],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base_url, api_key = _printed(out_path, up, timeout_s=400)
        assert api_key.startswith("im_")
        stack = json.loads((home / "stack.json").read_text())
        pids = json.loads((home / "pids.json").read_text())
        serving = {role for role in pids if role.startswith("serving:")}
        assert serving == {"serving:vllm-0", "serving:vllm-1", "serving:replica-agent-0",
                           "serving:replica-agent-1", "serving:gateway"}, pids  # fmt: skip

        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-llama", messages=[{"role": "user", "content": "The harbor keeps a ledger of"}],
            max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        completion = raw.parse()
        request_id = raw.headers["x-request-id"]
        assert completion.model == "tiny-llama" and completion.usage.completion_tokens == 8

        database_url = stack["database_url"]
        events = _wait_rows(
            database_url,
            "SELECT payload FROM raw_events WHERE customer_id = %s AND type = 'infermeter.request.v1'",
            (customer,), lambda rows: len(rows) >= 1,
        )  # fmt: skip
        assert len(events) == 1, events
        data = events[0][0]["data"]
        assert data["request_id"] == request_id and data["status"] == "ok"
        assert (data["model"], data["deployment_id"]) == ("tiny-llama", "tiny-cpu")
        assert data["replica_id"] in ("tiny-cpu-0", "tiny-cpu-1")
        assert data["input_tokens"] == completion.usage.prompt_tokens
        assert data["output_tokens"] == 8

        replicas = _wait_rows(
            database_url,
            "SELECT DISTINCT payload->'data'->>'replica_id' FROM raw_events WHERE type = 'infermeter.replica.v1'",
            (), lambda rows: len(rows) >= 2,
        )  # fmt: skip
        assert sorted(r[0] for r in replicas) == ["tiny-cpu-0", "tiny-cpu-1"]

        # pid and start time: pids are reused within minutes on this busy machine
        children = {pid: process_start(pid) for pid in _descendants(up.pid)}
        for role in serving:
            assert pids[role]["pid"] in children, (role, pids[role])
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(120)
    text = out_path.read_text(errors="replace")
    assert up.returncode == 0, text
    assert "stopped (SIGTERM)" in text
    still = {pid for pid, start in children.items() if start is not None and process_start(pid) == start}
    assert still == set(), still
    assert _left_behind(home) == {}
    assert not (home / "stack.json").exists() and not (home / "pids.json").exists()


def test_after_kill_9_of_up_serving_no_replica_agent_or_gateway_outlives_it(tmp_path: Path):
    """`kill -9` of `up --serving`: the kernel's parent-death signal stops every vLLM (a stand-in
    here, tests/cli/test_up.py's: the real one is covered above), replica agent and gateway; the
    next `up` on the home stops the PostgreSQL the killed run left, and then nothing is left."""
    from tests.cli.test_up import FAKE_VLLM

    home = Path(tempfile.mkdtemp(prefix="infermeter-up-serving-kill-")) / "home"
    home.mkdir(parents=True)
    python = tmp_path / "fake-vllm-python"
    python.write_text(FAKE_VLLM.format(python=sys.executable))
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(free_port()),
               INFERMETER_GATEWAY_PORT=str(free_port()), INFERMETER_VLLM_PYTHON=str(python))  # fmt: skip
    out_path = home / "up.out"
    with open(out_path, "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--serving", "--replicas", "2",
                               "--model", "fake"], env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _printed(out_path, up, timeout_s=120)
        pids = json.loads((home / "pids.json").read_text())
        serving = {role: pids[role] for role in pids if role.startswith("serving:")}
        assert len(serving) == 5, pids
        assert all(is_recorded_process(record) for record in serving.values())
    finally:
        up.kill()
        up.wait(10)
    deadline = time.monotonic() + 30
    # pid, start time and command line: pids are reused within minutes on this busy machine
    while (alive := {role for role, record in serving.items() if is_recorded_process(record)}) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == set()

    again = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--no-api"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (home / "stack.json").exists() or json.loads((home / "stack.json").read_text())["pid"] != again.pid:
            assert again.poll() is None and time.monotonic() < deadline, again.stdout.read()
            time.sleep(0.2)
    finally:
        again.send_signal(signal.SIGTERM)
        text, _ = again.communicate(timeout=60)
    assert again.returncode == 0, text
    assert "did not stop cleanly" in text
    assert _left_behind(home) == {}
    # the killed replicas' IPC folders (a deep home puts them under /tmp) went with the next `up`
    ipc = [record["ipc_folder"] for role, record in serving.items() if role.startswith("serving:vllm")]
    assert all(folder and folder.startswith("/tmp/vllm-rpc-") for folder in ipc), ipc
    assert not any(Path(folder).exists() for folder in ipc)
