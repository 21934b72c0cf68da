"""`infermeter up --serving --replicas 2`: the whole serving stack from one command, end to end.

One test, all real: `up` runs as a subprocess on a home of its own (embedded PostgreSQL, Tansu,
metering, the API) and starts two vLLM CPU replicas of the session's tiny model (`--model`, so the
model is not built twice), a replica agent each and the gateway. The test reads the base URL and
the key `up` prints, sends a chat completion through the official OpenAI client, finds its event
in metering's `raw_events` (and the agents' intervals of both replicas). Then, with chat completions
going on, it kills one replica's vLLM server with -9: what that server left running in its session
(vLLM's engine core, its worker, multiprocessing's resource tracker) is stopped, the replica is
restarted and answers again, and `up`'s /metrics/serving counts the restart. Last it sends SIGTERM
and checks that every process `up` started is gone (the process table, read from /proc): by pid and
start time, by the session of every child `up` recorded (each in a session of its own), and no
`VLLM::` process in any of those sessions. (One test: two vLLM CPU replicas take minutes to boot.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
from openai import OpenAI

from infermeter.stack.ports import free_port
from infermeter.stack.postgres import to_libpq_url
from infermeter.stack.processes import is_recorded_process, process_session, process_start, session_members
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


def _vllm_processes(sessions: set[int]) -> dict[int, str]:
    """Live `VLLM::` processes (vLLM's engine core and workers are titled so) of any of `sessions`."""
    found = {}
    for pid, (_, cmdline, _) in _processes().items():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()  # the title, cut to 15 characters
        except OSError:
            continue
        title = cmdline.split(b"\0")[0].decode(errors="replace").strip() if cmdline.startswith(b"VLLM::") else comm
        if title.startswith("VLLM::") and process_session(pid) in sessions:
            found[pid] = title
    return found


def _serving_sessions(home: Path) -> set[int]:
    """The sessions of the children `up` records now (each started in a session of its own: pid = session id)."""
    pids = json.loads((home / "pids.json").read_text())
    return {record["pid"] for role, record in pids.items() if role.startswith("serving:")}


def _until(condition, timeout_s: float, what, out_path: Path):
    """Waits for `condition`; `what` (a string, or a function making one at the failure) says what failed."""
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, (
            f"{what() if callable(what) else what} (not within {timeout_s:.0f} s):\n{out_path.read_text()[-4000:]}")
        time.sleep(0.5)
    return result


class _Traffic:
    """Chat completions through the gateway from `concurrency` threads until `stop`."""

    def __init__(self, base_url: str, api_key: str, concurrency: int) -> None:
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
        self.outcomes: list[tuple[float, str]] = []  # (time.monotonic() at the answer, "ok" or the error)
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(concurrency)]
        for thread in self.threads:
            thread.start()

    def _run(self, n: int) -> None:
        while not self.stopping.is_set():
            try:
                self.client.chat.completions.create(
                    model="tiny-llama", messages=[{"role": "user", "content": f"Worker {n} counts the tide tables"}],
                    max_tokens=8, temperature=0,
                )  # fmt: skip
                self.outcomes.append((time.monotonic(), "ok"))
            except Exception as exc:  # noqa: BLE001 - counted, shown on failure
                self.outcomes.append((time.monotonic(), repr(exc)))

    def answered_since(self, moment: float) -> int:
        return sum(1 for at, outcome in self.outcomes if at > moment and outcome == "ok")

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(150)


def test_up_serving_two_replicas_meters_a_chat_completion_heals_a_killed_replica_and_leaves_nothing_behind(
    tiny_model: Path, vllm_python: str
):
    # Outside pytest's 0700 tmp folders: the embedded server runs as its own system user.
    home = Path(tempfile.mkdtemp(prefix="infermeter-up-serving-")) / "home"
    home.mkdir(parents=True)
    customer = f"up-{uuid.uuid4().hex[:8]}"
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(
        INFERMETER_HOME=str(home),
        INFERMETER_API_PORT=str(api_port),
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
    sessions: set[int] = set()
    traffic = None
    try:
        base_url, api_key = _printed(out_path, up, timeout_s=900)
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
        sessions |= _serving_sessions(home)

        # A replica's server killed with -9 mid-traffic: the engine it leaves is stopped, the replica restarted.
        traffic = _Traffic(base_url, api_key, concurrency=2)
        _until(lambda: traffic.answered_since(0) >= 2, 120, "no chat completion answered", out_path)
        victim = pids["serving:vllm-0"]
        victim_url = f"http://127.0.0.1:{victim['port']}"
        assert process_session(victim["pid"]) == victim["pid"]  # its own session, so its engine's too
        engine = _vllm_processes({victim["pid"]})
        assert "VLLM::EngineCore" in engine.values(), engine
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        _until(lambda: session_members(victim["pid"]) == [], 60,
               f"what the killed server left in its session {victim['pid']} still runs", out_path)  # fmt: skip
        restarted = _until(
            lambda: (record := json.loads((home / "pids.json").read_text())["serving:vllm-0"])["pid"] != victim["pid"]
            and is_recorded_process(record) and record, 120, "replica tiny-cpu-0 was not restarted", out_path,
        )  # fmt: skip
        sessions |= _serving_sessions(home)
        assert restarted["port"] == victim["port"]  # where the gateway's upstream file and the agent look
        restarted_log = home / "vllm" / str(victim["port"]) / f"vllm-{victim['port']}.log"
        _until(lambda: _answers_200(victim_url + "/v1/models"), 600,
               lambda: "the restarted replica does not answer (the end of its log: "
               f"{restarted_log.read_text(errors='replace')[-3000:] if restarted_log.exists() else 'none'})",
               out_path)  # fmt: skip
        _until(lambda: "vLLM replica tiny-cpu-0 ready again" in out_path.read_text(errors="replace"), 10,
               "up did not say the replica is back", out_path)  # its watch looks every second  # fmt: skip
        text = out_path.read_text(errors="replace")
        assert "vLLM replica tiny-cpu-0 died (killed by SIGKILL); stopped what it left running (" in text, text[-4000:]
        assert "vLLM replica tiny-cpu-0: restart 1 (pid " in text
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/metrics/serving", timeout=10) as response:
            exposition = response.read().decode()
        assert 'infermeter_replica_restarts_total{replica="tiny-cpu-0"} 1.0' in exposition, exposition
        assert "tiny-cpu-1" not in exposition  # the other replica never died
        healed_at = time.monotonic()
        _until(lambda: traffic.answered_since(healed_at) >= 2, 120, "no answer after the restart", out_path)
        traffic.stop()
        assert traffic.answered_since(killed_at) >= 2, traffic.outcomes
        sessions |= _serving_sessions(home)
    finally:
        if traffic is not None:
            traffic.stop()
        up.send_signal(signal.SIGTERM)
        up.wait(180)
    text = out_path.read_text(errors="replace")
    assert up.returncode == 0, text
    assert "stopped (SIGTERM)" in text
    still = {pid for pid, start in children.items() if start is not None and process_start(pid) == start}
    assert still == set(), still
    assert len(sessions) == 6, sessions  # 2 vLLM (and the one restarted), 2 agents, the gateway
    assert {sid: session_members(sid) for sid in sessions if session_members(sid)} == {}
    assert _vllm_processes(sessions) == {}
    assert _left_behind(home) == {}
    assert not (home / "stack.json").exists() and not (home / "pids.json").exists()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


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
        # each replica on a core of its own, in turn, its "engine" child too; vLLM's in-process executor
        cores = sorted(os.sched_getaffinity(0))
        replicas = [pids[f"serving:vllm-{index}"]["pid"] for index in range(2)]
        for index, pid in enumerate(replicas):
            assert os.sched_getaffinity(pid) == {cores[index % len(cores)]}
            assert {frozenset(os.sched_getaffinity(child)) for child in _descendants(pid)} == {frozenset({cores[index % len(cores)]})}
            assert b"VLLM_ENABLE_V1_MULTIPROCESSING=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
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


def test_a_replica_that_keeps_dying_is_restarted_with_backoff_and_leaves_nothing(tmp_path: Path):
    """The restart backoff and its settings, on the stand-in vLLM of tests/cli/test_up.py (its
    "engine" child shares its session, as vLLM's do; the real one is covered above): killed with -9,
    the stand-in's engine is stopped and it comes back after INFERMETER_REPLICA_RESTART_BACKOFF_S;
    killed again before it stayed up a minute, after twice that, capped by
    INFERMETER_REPLICA_RESTART_BACKOFF_MAX_S; /metrics/serving counts 2 restarts; SIGTERM leaves
    nothing in any session `up` started."""
    from tests.cli.test_up import FAKE_VLLM

    home = Path(tempfile.mkdtemp(prefix="infermeter-up-serving-backoff-")) / "home"
    home.mkdir(parents=True)
    python = tmp_path / "fake-vllm-python"
    python.write_text(FAKE_VLLM.format(python=sys.executable))
    python.chmod(0o755)
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(api_port),
               INFERMETER_GATEWAY_PORT=str(free_port()), INFERMETER_VLLM_PYTHON=str(python),
               INFERMETER_REPLICA_RESTART_BACKOFF_S="0.5", INFERMETER_REPLICA_RESTART_BACKOFF_MAX_S="0.75",
               INFERMETER_REPLICA_STOP_GRACE_S="2")  # fmt: skip
    out_path = home / "up.out"
    with open(out_path, "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--serving", "--replicas", "2",
                               "--model", "fake"], env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    sessions: set[int] = set()
    try:
        _printed(out_path, up, timeout_s=180)
        sessions |= _serving_sessions(home)
        _kill_the_stand_in_and_see_it_back(home, out_path, restart=1, delay="0.5")
        sessions |= _serving_sessions(home)
        _kill_the_stand_in_and_see_it_back(home, out_path, restart=2, delay="0.75")  # not up a minute: 2 x 0.5, capped
        sessions |= _serving_sessions(home)
        # `up` prints the key before its API listens (it builds the app after the serving tier is up)
        _until(lambda: _answers_200(f"http://127.0.0.1:{api_port}/metrics/serving"), 120, "no API", out_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/metrics/serving", timeout=10) as response:
            assert 'infermeter_replica_restarts_total{replica="tiny-cpu-1"} 2.0' in response.read().decode()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(120)
    assert up.returncode == 0, out_path.read_text()
    assert len(sessions) == 7, sessions  # 2 stand-ins (one started 3 times), 2 agents, the gateway
    assert {sid: session_members(sid) for sid in sessions if session_members(sid)} == {}
    assert _left_behind(home) == {}


def _kill_the_stand_in_and_see_it_back(home: Path, out_path: Path, *, restart: int, delay: str) -> None:
    victim = json.loads((home / "pids.json").read_text())["serving:vllm-1"]["pid"]
    _until(lambda: len(session_members(victim)) == 2, 30, "the stand-in has no engine", out_path)
    os.kill(victim, signal.SIGKILL)
    _until(lambda: session_members(victim) == [], 30, "its engine still runs", out_path)
    _until(lambda: f"vLLM replica tiny-cpu-1: restart {restart} (pid " in out_path.read_text(), 30,
           f"no restart {restart}", out_path)  # fmt: skip
    _until(lambda: out_path.read_text().count("vLLM replica tiny-cpu-1 ready again") == restart, 30,
           f"not back after restart {restart}", out_path)  # fmt: skip
    assert (f"vLLM replica tiny-cpu-1 died (killed by SIGKILL); stopped what it left running (1 process); "
            f"restarting it in {delay} s") in out_path.read_text()  # fmt: skip


def test_restart_delay_doubles_per_restart_in_a_row_up_to_its_cap():
    from app.serving_stack import restart_delay

    for first_s, max_s, failures, expected in [
        (1.0, 60.0, 0, 1.0),
        (1.0, 60.0, 1, 2.0),
        (1.0, 60.0, 5, 32.0),
        (1.0, 60.0, 6, 60.0),  # 64 s capped
        (1.0, 64.0, 6, 64.0),  # exactly the cap
        (0.5, 0.75, 1, 0.75),
        (0.0, 60.0, 9, 0.0),  # no backoff
        (1.0, 60.0, 10_000, 60.0),  # hours of crashes in a row: no overflow
    ]:
        assert restart_delay(first_s, max_s, failures) == expected, (first_s, max_s, failures)
