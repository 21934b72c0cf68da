"""The stack a command uses: the configured database and broker, those of a running `infermeter up`
(INFERMETER_HOME/stack.json), or embedded ones started here."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infermeter.settings import Settings, get_settings
from infermeter.stack.broker import Broker, start_tansu
from infermeter.stack.pids import PidFile
from infermeter.stack.postgres import (
    embedded_pgdata,
    postmaster_pid,
    start_embedded_postgres,
    to_sqlalchemy_url,
)
from infermeter.stack.processes import pid_alive


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
    if not pid_alive(int(info.get("pid", -1))):
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
