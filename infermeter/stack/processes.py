"""Processes: children that die with their parent, a process's identity and state (from /proc),
and stopping a child together with everything left in its session."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


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
