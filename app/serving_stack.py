"""`infermeter up --serving`: the serving tier on top of the local stack, in one command.

    serving = ServingStack(settings, pid_file, console=err_console)
    serving.start(replicas=2, model=None, customer="local")  # vLLM replicas, agents, gateway, a key
    serving.base_url, serving.api_key
    serving.stop()                                           # gateway, agents, then vLLM

What it starts, each a child process of `up`, recorded in INFERMETER_HOME/pids.json (role
`serving:<name>`) and started with a parent-death signal (`infermeter.stack.processes.die_with_parent`), so
none outlives `up`, even on `kill -9`:

- N vLLM CPU replicas of the tiny model (serving/vllm_server.py, as `infermeter serve vllm` runs
  them; the model is built once into INFERMETER_HOME/models unless `model` names a directory),
  booting in parallel, with a rich progress line while they start;
- one replica agent per replica (`infermeter serve replica-agent`, deployment `tiny-cpu`,
  replica ids `tiny-cpu-<i>`, `--gpu-type cpu --gpu-count 1`);
- the gateway (`infermeter serve gateway`) on INFERMETER_GATEWAY_HOST:INFERMETER_GATEWAY_PORT with
  a generated upstream file, INFERMETER_HOME/serving/upstreams.yaml (model `tiny-llama`, one
  replica entry per vLLM);
- a customer API key, created through the key store the `keys` CLI uses (stored hashed) and kept
  for the next start in INFERMETER_HOME/serving/key-<customer>.json (mode 0600): a restart prints
  the same key while it is active (revoke it with `infermeter keys revoke` and the next start makes
  a new one) instead of leaving one more active key behind each time.

The agents and the gateway find the database and the broker through the stack file of the running
`up` (INFERMETER_HOME/stack.json), as they would if started by hand in another terminal; so the
stack file must be written before `start`. Logs: INFERMETER_HOME/serving/*.log.

A replica that dies (a crash, `kill -9`) is healed: a watch thread polls the replicas every
WATCH_S; a dead one's session is stopped (what its server leaves running: the engine core, its
workers, multiprocessing's resource tracker; on a GPU they would hold its memory), and it is
started again on the same port (the gateway's upstream file and its agent still point there) after
a backoff: INFERMETER_REPLICA_RESTART_BACKOFF_S (1 s), doubled for each restart in a row that did
not stay up STABLE_S, at most INFERMETER_REPLICA_RESTART_BACKOFF_MAX_S (60 s); what is left of a
session gets SIGTERM, then SIGKILL after INFERMETER_REPLICA_STOP_GRACE_S (5 s). Each step is a line
on the console, and each restart counts in `infermeter_replica_restarts_total{replica}`
(serving/metrics.py), served on `up`'s API at /metrics/serving (`add_metrics_route`). `stop` stops
every child's whole session the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infermeter.settings import Settings
from infermeter.stack import StackError
from infermeter.stack.pids import PidFile
from infermeter.stack.ports import free_port
from infermeter.stack.processes import die_with_parent, log_tail, process_record, stop_process_group
from infermeter.stack.signals import raise_if_signalled

DEPLOYMENT_ID = "tiny-cpu"
WATCH_S = 1.0  # how often the watch thread looks at the replicas
STABLE_S = 60.0  # a restarted replica answering this long starts the backoff over


def _replica_id(index: int) -> str:
    return f"{DEPLOYMENT_ID}-{index}"


@dataclass
class _Health:
    """What the watch thread knows of one replica."""

    ready_since: float | None  # time.monotonic() it answered since it (re)started, None while starting
    restarts: int = 0
    failures: int = 0  # restarts in a row that did not stay up STABLE_S (the backoff's exponent)
    restart_at: float | None = None  # set while a dead replica waits for its restart


@dataclass
class _Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 15.0, grace_s: float = 5.0) -> None:
        stop_process_group(self.process, timeout_s, grace_s)  # its whole session


@dataclass
class ServingStack:
    settings: Settings
    pid_file: PidFile
    console: Console
    folder: Path = field(init=False)
    replicas: list = field(default_factory=list)  # serving.vllm_server.VllmServer
    children: list[_Child] = field(default_factory=list)  # the agents and the gateway
    base_url: str | None = None
    api_key: str | None = None
    api_key_id: str | None = None
    _vllm: dict = field(default_factory=dict)  # python, model and served name: what a restart starts
    _health: list[_Health] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the watch's checks vs `stop`
    _stopping: threading.Event = field(default_factory=threading.Event)
    _stopped: threading.Event = field(default_factory=threading.Event)  # the replicas are stopped
    _watch_thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.folder = Path(self.settings.home) / "serving"

    # --- start ---------------------------------------------------------------------------------

    def start(self, *, replicas: int, model: str | None = None, customer: str = "local") -> None:
        """Everything, in order; raises StackError (what failed, with its log) and leaves what
        started to `stop`. Call from the main thread (the children die with the thread that
        started them)."""
        from serving.tinymodel import SERVED_NAME, ModelBuildError, ensure_tiny_model
        from serving.vllm_server import VllmError, resolve_python

        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            python = resolve_python(self.settings.vllm_python)
            if model is None:
                with self.console.status("building the tiny model (first use only)"):
                    model = str(ensure_tiny_model(Path(self.settings.home) / "models", python))
        except (VllmError, ModelBuildError) as exc:
            raise StackError(str(exc)) from None
        self._start_replicas(python, model, SERVED_NAME, replicas)
        upstreams = self._write_upstreams(SERVED_NAME)
        for index, server in enumerate(self.replicas):
            self._spawn(f"replica-agent-{index}", [
                "serve", "replica-agent", "--vllm", server.url, "--deployment", DEPLOYMENT_ID,
                "--gpu-type", "cpu", "--gpu-count", "1", "--replica-id", f"{DEPLOYMENT_ID}-{index}",
            ])  # fmt: skip
        host, port = self.settings.gateway_host, self.settings.gateway_port
        gateway = self._spawn("gateway", [
            "serve", "gateway", "--upstreams", str(upstreams), "--host", host, "--port", str(port),
        ])  # fmt: skip
        self._wait_gateway(gateway, f"http://{host}:{port}/health")
        self.base_url = f"http://{host}:{port}/v1"
        self.api_key_id, self.api_key = self._create_key(customer)
        now = time.monotonic()
        self._health = [_Health(ready_since=now) for _ in self.replicas]
        # It outlives the replicas it restarts (`_watch`): they get its parent-death signal.
        self._watch_thread = threading.Thread(target=self._watch, name="replica-watch", daemon=True)
        self._watch_thread.start()

    def _start_replicas(self, python: str, model: str, served_name: str, count: int) -> None:
        self._vllm = {"python": python, "model": model, "served_name": served_name}
        for index in range(count):
            self.replicas.append(self._spawn_replica(index, free_port()))
        pending = dict(enumerate(self.replicas))
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=self.console, transient=True) as progress:  # fmt: skip
            tasks = {
                index: progress.add_task(f"vLLM replica {_replica_id(index)} starting on {server.url}")
                for index, server in pending.items()
            }
            timeout_s = self.settings.replica_start_timeout_s
            deadline = time.monotonic() + timeout_s
            while pending:
                for index, server in list(pending.items()):
                    if server.process.poll() is not None:
                        self.console.print(server.log_tail(15), highlight=False, markup=False)
                        raise StackError(f"vLLM replica {index} exited with code {server.process.returncode} "
                                         f"(the end of its log is above; all of it in {server.log_path})")
                    if _answers(server.url + "/v1/models"):
                        del pending[index]
                        progress.update(tasks[index], description=f"vLLM replica {_replica_id(index)} "
                                        f"ready on {server.url}")
                        self.console.print(f"vLLM replica {_replica_id(index)} ready on {server.url}",
                                           highlight=False)
                if time.monotonic() > deadline:
                    raise StackError(f"vLLM replicas not ready after {timeout_s:g} s; logs in {self.settings.home}/vllm")
                raise_if_signalled()  # a signal whose `Stopped` was lost: stop now, not after the boot
                time.sleep(0.5)

    def _spawn_replica(self, index: int, port: int):
        """Start replica `index` on `port` (its state and log in INFERMETER_HOME/vllm/<port>) and record
        it; from the main thread at start, from the watch thread on a restart (its parent-death
        signal goes with the thread that started it)."""
        from serving.vllm_server import home_cache_dir, start_vllm

        # Each replica on a core of its own, in turn (vLLM's "auto" binds every replica's
        # engine to the same core: a replica restarted beside a busy one got no time on it and its
        # worker did not start in 600 s; CPU build only, a GPU build ignores it).
        cores = sorted(os.sched_getaffinity(0))
        server = start_vllm(
            self._vllm["python"], self._vllm["model"], served_model_name=self._vllm["served_name"], port=port,
            state_dir=Path(self.settings.home) / "vllm" / str(port), cpu_bind=str(cores[index % len(cores)]),
            cache_dir=home_cache_dir(self.settings.home),  # a restart finds its model described there
        )  # fmt: skip
        ipc = str(server.ipc_folder) if server.ipc_folder else None  # the next `up` removes it after a kill -9
        self.pid_file.record(f"serving:vllm-{index}", **process_record(server.process.pid, port=port, ipc_folder=ipc))
        return server

    # --- healing ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """The watch thread: every WATCH_S, each replica's `_check`, until `stop`; then it waits until
        the replicas are stopped (a replica it restarted gets SIGTERM when this thread exits)."""
        while not self._stopping.wait(WATCH_S):
            with self._lock:
                for index in range(len(self.replicas)):
                    if self._stopping.is_set():
                        break
                    try:
                        self._check(index, time.monotonic())
                    except Exception as exc:  # noqa: BLE001 - the watch must go on for the other replicas
                        self._say(f"vLLM replica {_replica_id(index)}: watching it failed ({exc!r}); trying again")
        self._stopped.wait()

    def _check(self, index: int, now: float) -> None:
        """One look at replica `index`: a dead one's session is stopped and its restart scheduled
        (backoff); a scheduled restart that is due starts it; a restarted one is watched until it
        answers."""
        from serving.metrics import REPLICA_RESTARTS

        health, server, name = self._health[index], self.replicas[index], _replica_id(index)
        if health.restart_at is not None:
            if now >= health.restart_at:
                port = int(server.url.rsplit(":", 1)[1])
                self.replicas[index] = server = self._spawn_replica(index, port)
                health.restart_at, health.ready_since = None, None
                health.restarts += 1
                REPLICA_RESTARTS.labels(replica=name).inc()
                self._say(f"vLLM replica {name}: restart {health.restarts} (pid {server.process.pid}) on {server.url}; "
                          f"log {server.log_path}")
            return
        code = server.process.poll()
        if code is None:
            if health.ready_since is None:
                if _answers(server.url + "/v1/models"):
                    health.ready_since = now
                    self._say(f"vLLM replica {name} ready again on {server.url}")
            elif health.failures and now - health.ready_since >= STABLE_S:
                health.failures = 0
            return
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        when = "" if health.ready_since is not None else " while starting"
        left = server.stop(grace_s=self.settings.replica_stop_grace_s)
        delay = restart_delay(self.settings.replica_restart_backoff_s, self.settings.replica_restart_backoff_max_s,
                              health.failures)  # fmt: skip
        health.failures += 1
        health.restart_at = now + delay
        leftovers = f"; stopped what it left running ({len(left)} process{'es' if len(left) > 1 else ''})" if left else ""
        self._say(f"vLLM replica {name} died{when} ({how}){leftovers}; restarting it in {delay:g} s")

    def _say(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    @staticmethod
    def add_metrics_route(api) -> None:
        """GET /metrics/serving on `up`'s API app: this process's serving metrics (the replica
        restarts), with no credentials, a scrape target like /metrics/metering."""
        from fastapi import Response

        from serving import metrics

        def serving_metrics() -> Response:
            return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

        api.add_api_route("/metrics/serving", serving_metrics, methods=["GET"], include_in_schema=False)

    def _write_upstreams(self, served_name: str) -> Path:
        path = self.folder / "upstreams.yaml"
        replicas = [{"id": _replica_id(i), "url": s.url} for i, s in enumerate(self.replicas)]
        config = {"models": [{"name": served_name, "deployment_id": DEPLOYMENT_ID, "replicas": replicas}]}
        path.write_text("# written by `infermeter up --serving`; rewritten at each start\n"
                        + yaml.safe_dump(config, sort_keys=False))
        return path

    def _spawn(self, name: str, args: list[str]) -> _Child:
        """`infermeter <args>` as a child in its own session, SIGTERM if `up` dies."""
        log_path = self.folder / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM),
            )  # fmt: skip
        child = _Child(name, process, log_path)
        self.children.append(child)
        self.pid_file.record(f"serving:{name}", **process_record(process.pid))
        return child

    def _wait_gateway(self, gateway: _Child, health_url: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.console.status(f"starting the gateway ({health_url})"):
            while not _answers(health_url):
                if gateway.process.poll() is not None:
                    self.console.print(gateway.log_tail(), highlight=False, markup=False)
                    raise StackError(f"the gateway exited with code {gateway.process.returncode} "
                                     f"(the end of its log is above; all of it in {gateway.log_path})")
                if time.monotonic() > deadline:
                    raise StackError(f"the gateway did not answer on {health_url} after {timeout_s:.0f} s")
                raise_if_signalled()
                time.sleep(0.2)

    def _create_key(self, customer: str) -> tuple[str, str]:
        from infermeter.db import get_engine
        from infermeter.stack.local import resolve_database_url
        from serving.keys import KeyStore

        engine = get_engine(resolve_database_url(self.settings))
        return KeyStore(engine, settings=self.settings).kept(customer, self.folder / f"key-{customer}.json")

    # --- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """No more restarts; then the gateway first (its last events spool and go to the broker,
        which still runs), then the agents (their last interval), then vLLM: each child's whole
        session, what it left running included (`infermeter.stack.processes.stop_process_group`)."""
        self._stopping.set()
        with self._lock:  # a check under way (a restart, a dead replica's clean-up) ends first
            grace_s = self.settings.replica_stop_grace_s
            for child in reversed(self.children):
                child.stop(grace_s=grace_s)
            self.children.clear()
            for server in self.replicas:
                server.stop(grace_s=grace_s)
            self.replicas.clear()
        self._stopped.set()
        if self._watch_thread is not None:
            self._watch_thread.join(30)

    def status_lines(self, customer: str) -> list[str]:
        return [
            f"serving: {len(self.replicas)} vLLM CPU replica(s) of tiny-llama (deployment {DEPLOYMENT_ID}), "
            f"a replica agent each, the gateway; logs in {self.folder}; a replica that dies is restarted",
            f"OPENAI_BASE_URL={self.base_url}",
            f"OPENAI_API_KEY={self.api_key}",
            f"(key {self.api_key_id} of customer {customer}: kept in {self.folder / f'key-{customer}.json'}, "
            "mode 0600; stored hashed in the database)",
        ]


def restart_delay(first_s: float, max_s: float, failures: int) -> float:
    """The delay before a dead replica's restart: `first_s` doubled `failures` times (the restarts in a
    row that did not stay up STABLE_S), at most `max_s`."""
    return min(first_s * 2.0 ** min(failures, 64), max_s)


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
        return response.status == 200
    return False
