"""`infermeter up`: the whole local stack in the foreground; other commands use it; Ctrl-C stops it.

No orphans: SIGINT, SIGTERM and SIGHUP stop everything it started; on `kill -9` its broker dies
with it and the next `up` on the same home says what it did with what was left (PostgreSQL).
The process table is read from /proc: a process is the stack's if its command line or environment
names the test's INFERMETER_HOME (Tansu inherits it, the postmaster runs on HOME/pg), or if it
descends from one that does (PostgreSQL's backends). Zombies count as gone: nothing reaps
orphans in some containers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from infermeter.settings import Settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.pids import PidFile
from infermeter.stack.ports import free_port, wait_for_port
from infermeter.stack.processes import process_cmdline, process_record
from infermeter.stack.stale import clean_stale
from tests.cli.test_cli import run
from tests.metering.conftest import request_event


def test_up_serves_metering_and_the_api_until_ctrl_c(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="infermeter-up-")) / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(port), INFERMETER_ADMIN_TOKEN="test-admin-token")
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
                request = urllib.request.Request(url, headers={"Authorization": "Bearer test-admin-token"})
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
    assert not (home / "pids.json").exists()
    assert _left_behind(home) == {}


# --- no orphans --------------------------------------------------------------------------------


def _processes() -> dict[int, tuple[int, bytes, bytes]]:
    """pid -> (ppid, cmdline, environ) of every live (not zombie) process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                environ = b""
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            table[int(entry.name)] = (int(fields[1]), cmdline, environ)
    return table


def _left_behind(home: Path, wait_s: float = 10.0) -> dict[int, str]:
    """The processes of the stack on `home` still alive after up to `wait_s` seconds (pid -> command)."""
    marker = str(home).encode()
    deadline = time.monotonic() + wait_s
    while True:
        table = _processes()
        ours = {pid for pid, (_, cmd, env) in table.items() if marker in cmd or marker in env}
        grew = True
        while grew:
            children = {pid for pid, (ppid, _, _) in table.items() if ppid in ours} - ours
            ours |= children
            grew = bool(children)
        ours.discard(os.getpid())
        if not ours or time.monotonic() > deadline:
            return {pid: table[pid][1].replace(b"\0", b" ").decode(errors="replace") for pid in ours}
        time.sleep(0.2)


def _start_up(home: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(free_port()))
    return subprocess.Popen([sys.executable, "-m", "app.cli", "up", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(up: subprocess.Popen, home: Path, timeout_s: float = 240) -> dict:
    """The pid records of a running `up`, once its stack file is written (the API may still be starting).
    The limit is generous: on a loaded 2-core machine an `up` with its PostgreSQL and broker took over 90 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert up.poll() is None, up.stdout.read()
        assert time.monotonic() < deadline, "up did not start"
        try:
            if json.loads((home / "stack.json").read_text())["pid"] == up.pid:  # not a killed run's file
                return json.loads((home / "pids.json").read_text())
        except (OSError, ValueError):
            pass
        time.sleep(0.1)


@pytest.fixture(scope="module")
def up_home():
    # Outside pytest's 0700 tmp folders: the embedded server runs as its own system user.
    home = Path(tempfile.mkdtemp(prefix="infermeter-orphans-")) / "home"
    yield home
    assert _left_behind(home, wait_s=0) == {}


def _check_gateway_stops_on(sig: int, home: Path) -> None:
    """`serve gateway` on the running stack stops cleanly (graceful uvicorn shutdown, exit 0) on `sig`."""
    port = free_port()
    env = {**os.environ, "INFERMETER_HOME": str(home)}
    gateway = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "gateway", "--port", str(port),
                                "--upstream", "http://127.0.0.1:9", "--model", "m"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=60)
    finally:
        gateway.send_signal(sig)
        out, _ = gateway.communicate(timeout=30)
    assert gateway.returncode == 0, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_everything_up_started(up_home, sig):
    up = _start_up(up_home)
    pids = _wait_ready(up, up_home)
    assert {"up", "broker", "postgres"} <= set(pids)
    started = _left_behind(up_home, wait_s=0)
    assert pids["broker"]["pid"] in started and pids["postgres"]["pid"] in started, started
    _check_gateway_stops_on(sig, up_home)
    up.send_signal(sig)
    out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert f"stopped ({signal.Signals(sig).name})" in out
    assert _left_behind(up_home) == {}
    assert not (up_home / "stack.json").exists() and not (up_home / "pids.json").exists()


def test_after_kill_9_the_broker_dies_and_the_next_up_reuses_postgres_and_says_so(up_home):
    up = _start_up(up_home, "--no-api")
    pids = _wait_ready(up, up_home)
    up.kill()
    up.wait(10)
    # the broker dies with its parent (PR_SET_PDEATHSIG); PostgreSQL (daemonized by pg_ctl) stays
    left = _left_behind(up_home, wait_s=5)
    assert pids["broker"]["pid"] not in left
    assert pids["postgres"]["pid"] in left, left

    again = _start_up(up_home, "--no-api")
    pgdata = pids["postgres"]["pgdata"]
    try:
        _wait_ready(again, up_home)
    finally:
        again.send_signal(signal.SIGTERM)
        out, _ = again.communicate(timeout=60)
    assert f"the previous infermeter up on this home (pid {pids['up']['pid']}) did not stop cleanly" in out
    assert f"the broker of a previous run (pid {pids['broker']['pid']}" in out and "had already exited" in out
    assert f"reusing PostgreSQL already running on {pgdata} (pid {pids['postgres']['pid']})" in out.replace("\n", "")
    assert again.returncode == 0, out
    assert _left_behind(up_home) == {}  # the reused PostgreSQL stopped with the run that adopted it


def test_a_stale_broker_is_stopped_and_a_process_that_is_not_ours_is_left_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, database_url="postgresql://unused")  # the broker part only
    pid_file = PidFile(home / "pids.json")

    broker = start_tansu(log_path=tmp_path / "tansu.log")  # as if left by a run killed where PDEATHSIG is not
    pid_file.record("broker", **broker.record())
    [line] = clean_stale(settings, pid_file)[1:]
    assert line.startswith(f"found a stale broker (pid {broker.process.pid}, port ") and "stopped it" in line
    assert broker.process.wait(5) is not None

    bystander = subprocess.Popen(["sleep", "60"])
    try:
        while process_cmdline(bystander.pid) != ["sleep", "60"]:  # until exec is done
            time.sleep(0.01)
        record = process_record(bystander.pid)
        pid_file.record("broker", **{**record, "argv": ["/somewhere/tansu", "broker"]})  # pid reused by another program
        [line] = clean_stale(settings, pid_file)[1:]
        assert line == f"the previous run's broker pid {bystander.pid} is now another process: left it alone"
        pid_file.record("up", **record)  # a live `up` on this home (its record matches): refuse to start
        with pytest.raises(Exception, match=f"infermeter up already runs on .* \\(pid {bystander.pid}\\)"):
            clean_stale(settings, pid_file)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# --- a port already taken ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "setting"), [
    ((), "INFERMETER_API_PORT"),
    (("--serving",), "INFERMETER_API_PORT"),
    (("--serving",), "INFERMETER_GATEWAY_PORT"),
], ids=["up", "serving-api", "serving-gateway"])  # fmt: skip
def test_up_with_its_port_taken_says_which_in_one_line_and_starts_nothing(tmp_path, args, setting):
    """The port is checked before anything starts: one line naming the port and its setting, exit 2,
    no PostgreSQL, broker or vLLM (a stand-in: the check must come before it) started."""
    home = Path(tempfile.mkdtemp(prefix="infermeter-port-taken-")) / "home"
    python = tmp_path / "fake-vllm-python"
    python.write_text(FAKE_VLLM.format(python=sys.executable))
    python.chmod(0o755)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
        env.update(INFERMETER_HOME=str(home), INFERMETER_API_PORT=str(free_port()),
                   INFERMETER_GATEWAY_PORT=str(free_port()), INFERMETER_VLLM_PYTHON=str(python))  # fmt: skip
        env[setting] = str(port)
        extra = ("--model", "fake") if args else ()
        done = subprocess.run([sys.executable, "-m", "app.cli", "up", *args, *extra], env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 ({setting}) is already in use: stop what listens there or set "
        f"{setting} to a free port"
    ], done.stderr
    assert not (home / "pg").exists() and not (home / "pids.json").exists() and not (home / "stack.json").exists()
    assert _left_behind(home, wait_s=0) == {}


# --- serve vllm: a stand-in for vLLM (the real one takes minutes to boot on CPU) ---------------

FAKE_VLLM = """#!{python}
# Stands in for `python -m vllm.entrypoints.openai.api_server`: answers /v1/models, has an
# "engine" child like vLLM's, and on SIGTERM stops the engine and exits, as vLLM does.
import http.server, os, signal, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
stopping = []
def stop(*_):
    # SIGTERM can come more than once: a parent-death signal is sent again each time the process it
    # was re-parented to (another thread of the killed parent) dies. A second call inside the first's
    # engine.wait() would deadlock on Popen's wait lock: only the first call stops.
    if stopping:
        return
    stopping.append(True)
    engine.terminate()
    engine.wait()
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{{"data": []}}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever(poll_interval=0.1)
"""


def _serve_fake_vllm(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    home = Path(tempfile.mkdtemp(prefix="infermeter-vllm-orphans-")) / "home"
    python = tmp_path / "fake-vllm-python"
    python.write_text(FAKE_VLLM.format(python=sys.executable))
    python.chmod(0o755)
    env = {**os.environ, "INFERMETER_HOME": str(home), "INFERMETER_VLLM_PYTHON": str(python)}
    serve = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "vllm", "--model", "fake",
                              "--port", str(free_port())], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    for line in serve.stdout:
        if "vLLM ready" in line:
            break
    else:
        raise AssertionError(f"serve vllm exited with {serve.wait()}")
    assert len(_left_behind(home, wait_s=0)) == 3  # serve vllm, "vLLM", its engine
    return serve, home


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_serve_vllm_leaves_no_vllm_behind(tmp_path, sig):
    serve, home = _serve_fake_vllm(tmp_path)
    serve.send_signal(sig)
    out, _ = serve.communicate(timeout=30)
    if sig != signal.SIGKILL:
        assert serve.returncode == 0 and "stopping vLLM" in out, out
    # on kill -9, vLLM gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops its engine itself
    assert _left_behind(home) == {}
