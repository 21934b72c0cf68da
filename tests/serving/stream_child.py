"""A streaming client in a process of its own, for tests/serving/test_anatomy_replay.py.

    python -m tests.serving.stream_child '{"url", "token", "body", "leave_after", "kill_at", "engine_pgid"}'

Streams POST /v1/completions and leaves after `leave_after` chunks, or SIGKILLs the replica's
process group once `kill_at` chunks have arrived. Prints {"chunks", "last", "request_id", "trace",
"slices"} as JSON: data chunks read, the last `data:` line, the gateway's request id, the first
chunks' arrival times and text lengths, and the engine's slices (how many, the longest, their sum).

Why a process of its own, and why the replica's engine is paced: on this 2-core machine vLLM CPU
generates 1800 tokens in ~2-3 s, and its API server (and anything else) can wait for a core meanwhile:
the stream then reaches the client in bursts, sometimes all of it at the end, so a client that leaves
after 20 chunks, or a kill after 10, could come after the whole answer was out (the request is then
rightly `ok`). So the replica's engine processes (every process of `engine_pgid`'s group but its
leader, the API server) are stopped (SIGSTOP) before the request and let run in 10 ms slices, the next
slice only once the chunks of the last one have reached this client (or 0.5 s passed). Alone here,
the engine then made exactly the 20 tokens the client read before it left. Under a heavy load this
process itself can wait seconds for a core in the middle of a slice, and the engine runs on meanwhile:
the test then tries again. The engine runs freely again (SIGCONT) when this ends, or once it has
been paced for PACE_FOR_S without the wanted chunks (the stream then runs to its end or to the
client's leaving unpaced, and the test judges that try by its metered status like any other). Why
the cap: in one CI run a paced stream gave its client fewer than 20 chunks in 180 s. Not explained
for certain; a likely cause is that vLLM's engine hands each step to its worker process through a
shared-memory queue whose reader goes idle after 1 s (wall clock) without a read and then parks up to
5 s at a time when a wake-up is missed; paced slices make such gaps. Gaps of 4.3 s between two
chunks were seen here with the engine paced.

For a test that fails, it tells where it was: a line on stderr when the answer starts, at each chunk
and every 20 slices, and every thread's stack on SIGUSR1 (the test sends it before a timeout's kill).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

SLICE_S = 0.01
PACE_FOR_S = 60.0
STARTED = time.monotonic()


def note(what: str) -> None:
    """A progress line on stderr (read by the test only when the child fails or hangs)."""
    print(f"{time.monotonic() - STARTED:8.3f} {what}", file=sys.stderr, flush=True)


def engine_pids(pgid: int) -> list[int]:
    """The processes of the group but its leader (vLLM's API server): the engine core and worker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != pgid:
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                pass
    return pids


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def resume(pids: list[int]) -> None:
    """Let stopped engine processes run freely again."""
    _signal(pids, signal.SIGCONT)


class Pacer:
    """Lets the engine run a slice at a time while `wanted` chunks have not arrived."""

    def __init__(self, pids: list[int], wanted: int) -> None:
        self.pids, self.wanted, self.seen = pids, wanted, 0
        self.arrived = threading.Condition()
        self.done = False
        self.slices: list[float] = []  # how long the engine ran each time (the stop comes late under load)
        _signal(pids, signal.SIGSTOP)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def chunk(self) -> None:
        with self.arrived:
            self.seen += 1
            self.arrived.notify_all()

    def _run(self) -> None:
        deadline = time.monotonic() + PACE_FOR_S
        while True:
            with self.arrived:
                if self.done or self.seen >= self.wanted:
                    return
                before = self.seen
            if time.monotonic() > deadline:
                note(f"paced for {PACE_FOR_S:g} s with {before} chunks: the engine runs freely")
                resume(self.pids)
                return
            resumed = time.monotonic()
            _signal(self.pids, signal.SIGCONT)
            time.sleep(SLICE_S)
            _signal(self.pids, signal.SIGSTOP)
            self.slices.append(time.monotonic() - resumed)
            if len(self.slices) % 20 == 0:
                note(f"slices {len(self.slices)}, chunks {self.seen}, ran {sum(self.slices):.3f} s")
            with self.arrived:
                self.arrived.wait_for(lambda before=before: self.done or self.seen > before, timeout=0.5)

    def stop(self) -> None:
        with self.arrived:
            self.done = True
            self.arrived.notify_all()
        self.thread.join(5)
        resume(self.pids)


def main(args: dict) -> dict:
    seen, last, trace, request_id = 0, "", [], None
    leave_after, kill_at = args.get("leave_after"), args.get("kill_at")
    pgid = args["engine_pgid"]
    pacer = Pacer(engine_pids(pgid), leave_after or kill_at)
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {args['token']}"}
    try:
        with httpx.Client(base_url=args["url"], timeout=120) as http, http.stream(
            "POST", "/v1/completions", json=args["body"], headers=headers
        ) as response:
            assert response.status_code == 200, response.read()
            request_id = response.headers["x-request-id"]
            note(f"answer started: {request_id}")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    last = line
                if not line.startswith("data: {"):
                    continue
                seen += 1
                pacer.chunk()
                note(f"chunk {seen}")
                if len(trace) < 40:
                    chunk = json.loads(line[6:])
                    text = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
                    trace.append((round(time.monotonic() - started, 3), len(text)))
                if seen == kill_at:
                    os.killpg(pgid, signal.SIGKILL)  # the API server and its engine, stopped or not
                if seen == leave_after:
                    break  # closing the response drops the connection: the client has gone
    finally:
        pacer.stop()
    return {"chunks": seen, "last": last, "request_id": request_id, "trace": trace[:3],
            "slices": (len(pacer.slices), round(max(pacer.slices, default=0), 3), round(sum(pacer.slices), 3))}


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.dump_traceback_later(150)  # stacks on stderr before the test's 180 s limit, whatever else happens
    print(json.dumps(main(json.loads(sys.argv[1]))))
