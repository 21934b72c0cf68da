"""What an `infermeter up` killed on the same home left behind: stopped, reused or forgotten."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from infermeter.settings import Settings
from infermeter.stack import StackError
from infermeter.stack.local import running_stack, stack_file
from infermeter.stack.pids import PidFile
from infermeter.stack.postgres import embedded_pgdata, postmaster_pid, prune_postgres_users
from infermeter.stack.processes import is_recorded_process, process_start, stop_recorded_process


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
