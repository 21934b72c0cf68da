"""INFERMETER_HOME/pids.json: what `infermeter up` started or uses, so that the next run can find it."""

from __future__ import annotations

import json
from pathlib import Path

from infermeter.settings import Settings
from infermeter.stack.processes import process_record


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
