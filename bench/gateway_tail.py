"""Where the gateway's latency tail at the open-loop rate goes, next to the metered floor's.

    python -m bench.gateway_tail [--rate 200] [--duration 10] [--hogs N] [--callbacks] [--json FILE]

The bench's stack (embedded PostgreSQL and broker, the stub upstream, the gateway as
`infermeter serve gateway` runs it, the metered floor of bench/gateway.py), every process started
through a probe, and one open loop at `--rate` in alternating 1 s blocks, direct, gateway and
metered floor (all three alive throughout, so that they share the same seconds of the machine).

The probe (`install_probe`, a debug-only wrapper: no product code changes) runs each process's
event loop as a subclass of its own loop class (uvloop's, or asyncio's for the load generator)
that wraps the transports and protocols of the connections it creates or accepts, and records,
on the one monotonic clock every process shares (`time.perf_counter`):
- per request (each carries its sequence number in the body's `user` field, which the proxies
  forward as they are): the client's start, its write, the proxy's first read of it, the
  proxy's upstream write, the stub's read and answer, the proxy's first read of the answer, the
  proxy's answer write, the client's first read and its end. So every request's time splits
  into: client -> proxy (the proxy's loop not yet running it: the run queue or other work on
  the loop), the proxy's work before the upstream, the upstream leg, the proxy's work after it,
  and proxy -> client;
- `data_received` calls longer than 0.3 ms, the garbage collector's collections
  (`gc.callbacks`: start, duration, generation, thread), the jobs run in the loop's executor
  (`run_in_executor`, `asyncio.to_thread`: what, on which thread, when), and with `--callbacks`
  every loop callback longer than 0.5 ms (a wrapper around each: slower);
- the run-queue wait of every thread of every process (`/proc/<pid>/task/<tid>/schedstat`, the
  second field: time runnable but not running), read at each block's start and end.

`--hogs N` runs N busy processes (pure Python loops) during the blocks: a machine with N more
runnable processes, as when the test suite runs beside the gateway. The report prints, per
target: p50/p99/p99.9, the top 1% of requests against the median split into the legs above, the
loop thread's run-queue wait a request and a second, and which of the slow requests coincide
with a collection, a slow callback or an executor job."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# --- the probe (runs inside each measured process) ----------------------------------------------

_EVENTS: list[tuple] = []  # (t, code, tag): rx / tx / uw / ur / cs / cd
_SLOW: list[tuple] = []  # (t, duration, what)
_GC: list[tuple] = []  # (t, duration, generation, collected, thread id)
_JOBS: list[tuple] = []  # (t, duration, what, thread id)
_TAG = b'"user":"t'


def _tag_of(data) -> int | None:
    start = data.find(_TAG)
    if start < 0:
        return None
    start += len(_TAG)
    return int(data[start : data.index(b'"', start)])


class _Transport:
    """A transport whose writes are stamped with the request on its connection."""

    def __init__(self, transport, conn) -> None:
        self._transport = transport
        self._conn = conn

    def write(self, data) -> None:
        self._conn.written(data)
        self._transport.write(data)

    def writelines(self, lines) -> None:
        self._conn.written(b"".join(lines))
        self._transport.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _Conn(asyncio.Protocol):
    """A protocol in front of the real one: stamps reads and writes with the connection's request.
    `served`: an accepted connection (requests in, answers out), else an outgoing one."""

    def __init__(self, protocol, served: bool) -> None:
        self.protocol = protocol
        self.served = served
        self.tag = None
        self.first = None  # served: time of the first read of the request in progress
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = _Transport(transport, self)
        self.protocol.connection_made(self.transport)

    def written(self, data) -> None:
        now = time.perf_counter()
        if self.served:
            _EVENTS.append((now, "tx", self.tag))
            self.first = None
        else:
            tag = _tag_of(data)
            if tag is not None:
                self.tag = tag
                _EVENTS.append((self.first or now, "uw", tag))
                self.first = None
            elif self.first is None:
                self.first = now  # a head written apart from its body

    def data_received(self, data) -> None:
        now = time.perf_counter()
        if self.served:
            if self.first is None:
                self.first = now
            tag = _tag_of(data)
            if tag is not None:
                self.tag = tag
                _EVENTS.append((self.first, "rx", tag))
        else:
            _EVENTS.append((now, "ur", self.tag))
        self.protocol.data_received(data)
        took = time.perf_counter() - now
        if took > 0.0003:
            _SLOW.append((now, took, f"data_received {type(self.protocol).__name__} t{self.tag}"))

    def eof_received(self):
        return self.protocol.eof_received()

    def connection_lost(self, exc) -> None:
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()


def _timed(callback, threshold: float):
    def run(*args):
        started = time.perf_counter()
        try:
            return callback(*args)
        finally:
            took = time.perf_counter() - started
            if took > threshold:
                _SLOW.append((started, took, repr(callback)[:200]))

    return run


def probe_loop(base: type, *, callbacks: bool = False) -> type:
    """`base` (an event loop class) with its connections stamped, its executor jobs and (with
    `callbacks`) its slow callbacks recorded."""

    class ProbeLoop(base):
        async def create_server(self, protocol_factory, *args, **kwargs):
            return await super().create_server(lambda: _Conn(protocol_factory(), True), *args, **kwargs)

        async def create_connection(self, protocol_factory, *args, **kwargs):
            _transport, conn = await super().create_connection(
                lambda: _Conn(protocol_factory(), False), *args, **kwargs
            )
            return conn.transport, conn.protocol

        def run_in_executor(self, executor, func, *args):
            inner = func  # asyncio.to_thread: partial(context.run, f, ...); the caches: partial(f, ...)
            while isinstance(inner, functools.partial):
                inner = (
                    inner.args[0] if inner.func.__qualname__ == "Context.run" and inner.args else inner.func
                )
            what = getattr(inner, "__qualname__", repr(inner)[:80])

            def job():
                started = time.perf_counter()
                try:
                    return func(*args)
                finally:
                    _JOBS.append((started, time.perf_counter() - started, what, threading.get_native_id()))

            return super().run_in_executor(executor, job)

        if callbacks:

            def call_soon(self, callback, *args, context=None):
                return super().call_soon(_timed(callback, 0.0005), *args, context=context)

            def call_later(self, delay, callback, *args, context=None):
                return super().call_later(delay, _timed(callback, 0.0005), *args, context=context)

            def call_at(self, when, callback, *args, context=None):
                return super().call_at(when, _timed(callback, 0.0005), *args, context=context)

    return ProbeLoop


def _gc_callback(phase: str, info: dict, started: list[float]) -> None:
    if phase == "start":
        started.append(time.perf_counter())
    elif started:
        begun = started.pop()
        _GC.append((begun, time.perf_counter() - begun, info["generation"], info["collected"],
                    threading.get_native_id()))  # fmt: skip


def _dump(path: Path) -> None:
    threads = {t.native_id: t.name for t in threading.enumerate()}
    path.write_text(json.dumps({
        "pid": os.getpid(), "loop_tid": _LOOP_TID[0], "threads": threads, "events": _EVENTS,
        "slow": _SLOW, "gc": _GC, "jobs": _JOBS,
    }))  # fmt: skip


_LOOP_TID = [0]


def install_probe(name: str, out: Path, *, callbacks: bool = False) -> None:
    """Every uvloop loop this process makes becomes a probe loop; SIGUSR1 writes `out/name.json`."""
    import uvloop

    probe = probe_loop(uvloop.Loop, callbacks=callbacks)
    run = uvloop.run
    uvloop.Loop = probe  # uvloop.run's check (isinstance) and its policy's factory look it up
    uvloop.new_event_loop = probe
    uvloop.run = lambda main, **kwargs: run(main, **{**kwargs, "loop_factory": probe})
    _LOOP_TID[0] = threading.get_native_id()  # these processes run their loop on the main thread
    started: list[float] = []
    gc.callbacks.append(lambda phase, info: _gc_callback(phase, info, started))
    signal.signal(signal.SIGUSR1, lambda *_: _dump(out / f"{name}.json"))


# --- the harness ----------------------------------------------------------------------------------


def _schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """{tid: (ns on a core, ns runnable and waiting)} of every thread of `pid`."""
    out = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                on_cpu, waiting, _slices = open(f"/proc/{pid}/task/{task}/schedstat").read().split()
                out[int(task)] = (int(on_cpu), int(waiting))
    return out


async def _one(session, url, headers, tag: int, payload: bytes) -> None:
    started = time.perf_counter()
    _EVENTS.append((started, "cs", tag))
    try:
        async with session.post(url, data=payload, headers=headers) as response:
            await response.read()
            ok = response.status == 200
    except Exception:  # noqa: BLE001 - counted as an error
        ok = False
    _EVENTS.append((time.perf_counter(), "cd" if ok else "ce", tag))


async def open_loop(targets, rate: float, duration_s: float, pids: dict[str, int], body: dict) -> dict:
    """The bench's open loop (`bench.gateway.open_loop`), every request tagged, all targets in
    alternating 1 s blocks; schedstat of `pids` at each block's start and end."""
    import aiohttp

    seq = [0]

    def payload() -> tuple[int, bytes]:
        seq[0] += 1
        return seq[0], json.dumps(dict(body, user=f"t{seq[0]}"), separators=(",", ":")).encode()

    blocks: list[dict] = []
    async with contextlib.AsyncExitStack() as stack:
        sessions = {}
        for name, url, headers in targets:
            session = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            )
            sessions[name] = (session, url, {"Content-Type": "application/json", **headers})
            for _ in range(int(rate * 0.3)):  # warm the connection pool
                await _one(session, url, sessions[name][2], *payload())
        for block in range(max(1, round(duration_s))):
            order = targets if block % 2 == 0 else targets[::-1]
            for name, _url, _headers in order:
                session, url, headers = sessions[name]
                before = {who: _schedstat(pid) for who, pid in pids.items()}
                started = time.perf_counter()
                tags, tasks = [], []
                for n in range(int(rate)):
                    delay = started + n / rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tag, data = payload()
                    tags.append(tag)
                    tasks.append(asyncio.ensure_future(_one(session, url, headers, tag, data)))
                await asyncio.gather(*tasks)
                ended = time.perf_counter()
                after = {who: _schedstat(pid) for who, pid in pids.items()}
                blocks.append({"target": name, "start": started, "end": ended, "first": tags[0], "last": tags[-1],
                               "sched": {who: {tid: [a[0] - before[who].get(tid, (0, 0))[0],
                                                     a[1] - before[who].get(tid, (0, 0))[1]]
                                               for tid, a in after[who].items()} for who in pids}})  # fmt: skip
    return {"blocks": blocks}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


LEGS = ("client", "to proxy", "proxy before", "upstream", "proxy after", "to client", "client end")


def _legs(client: dict, proxy: dict | None, stub: dict, tag: int) -> dict | None:
    """A request's legs in ms (direct: client, upstream, client end only)."""
    try:
        cs, cd = client["cs"][tag], client["cd"][tag]
        cw, cr = client["uw"][tag], client["ur"][tag]
        if proxy is None:
            legs = {"total": cd - cs, "client": cw - cs, "upstream": cr - cw, "client end": cd - cr}
            return {k: v * 1000 for k, v in legs.items()}
        pin, pout, puw, pur = proxy["rx"][tag], proxy["tx"][tag], proxy["uw"][tag], proxy["ur"][tag]
    except KeyError:
        return None
    legs = {"total": cd - cs, "client": cw - cs, "to proxy": pin - cw, "proxy before": puw - pin,
            "upstream": pur - puw, "proxy after": pout - pur, "to client": cr - pout, "client end": cd - cr}  # fmt: skip
    with contextlib.suppress(KeyError):
        legs["stub"] = stub["tx"][tag] - stub["rx"][tag]
    return {k: v * 1000 for k, v in legs.items()}


def _first(events: list, kinds=("cs", "cd", "uw", "ur", "rx", "tx")) -> dict[str, dict[int, float]]:
    """{kind: {tag: time}}: a request's first stamp of each kind (its last for `cd`)."""
    out: dict[str, dict[int, float]] = {k: {} for k in kinds}
    for t, kind, tag in events:
        if kind in out and tag is not None and (kind == "cd" or tag not in out[kind]):
            out[kind][tag] = t
    return out


def analyse(dumps: dict[str, dict], blocks: list[dict], client_events: list) -> dict:
    client = _first(client_events)
    stamps = {name: _first(d["events"]) for name, d in dumps.items()}
    report = {}
    for target in ("direct", "gateway", "metered"):
        mine = [b for b in blocks if b["target"] == target]
        tags = [t for b in mine for t in range(b["first"], b["last"] + 1)]
        legs = {
            t: _legs(client, None if target == "direct" else stamps[target], stamps["stub"], t) for t in tags
        }
        legs = {t: v for t, v in legs.items() if v is not None}
        totals = sorted(legs, key=lambda t: legs[t]["total"])
        top = totals[int(len(totals) * 0.99) :]
        middle = totals[int(len(totals) * 0.45) : int(len(totals) * 0.55)]
        row = {"requests": len(legs), "p50": _pct([v["total"] for v in legs.values()], 0.5),
               "p99": _pct([v["total"] for v in legs.values()], 0.99),
               "p99.9": _pct([v["total"] for v in legs.values()], 0.999)}  # fmt: skip
        names = [k for k in legs[totals[0]] if k != "total"] if totals else []
        row["median_legs"] = {k: statistics.median(legs[t][k] for t in middle) for k in names if middle}
        row["top1_legs"] = {k: statistics.mean(legs[t][k] for t in top) for k in names if top}
        first_of = {t: b["first"] for b in mine for t in range(b["first"], b["last"] + 1)}
        row["top1_position_in_block"] = sorted(t - first_of[t] for t in top)
        # the same without each block's first three requests (the ones that follow an idle gap)
        steady = [t for t in totals if t - first_of[t] >= 3]
        steady_top = steady[int(len(steady) * 0.99) :]
        row["steady_p99"] = _pct([legs[t]["total"] for t in steady], 0.99)
        row["steady_top1_legs"] = {
            k: statistics.mean(legs[t][k] for t in steady_top) for k in names if steady_top
        }
        row["block_starts"] = [round(legs[b["first"]]["total"], 2) for b in mine if b["first"] in legs]
        row["legs"] = {t: {k: round(v, 4) for k, v in legs[t].items()} for t in totals}
        row["top1_largest_leg"] = {}
        for t in top:
            leg = max(names, key=lambda k: legs[t][k] - row["median_legs"].get(k, 0))
            row["top1_largest_leg"][leg] = row["top1_largest_leg"].get(leg, 0) + 1
        # the loop thread's run-queue wait (and on-core time), a request and a second
        for who in ("gateway", "metered", "stub"):
            tid = str(dumps[who]["loop_tid"])
            wait = sum(b["sched"][who].get(tid, b["sched"][who].get(int(tid), [0, 0]))[1] for b in mine)
            run = sum(b["sched"][who].get(tid, b["sched"][who].get(int(tid), [0, 0]))[0] for b in mine)
            seconds = sum(b["end"] - b["start"] for b in mine)
            row[f"{who}_loop_wait_us_per_req"] = wait / 1000 / max(1, len(tags))
            row[f"{who}_loop_wait_ms_per_s"] = wait / 1e6 / seconds
            row[f"{who}_loop_cpu_us_per_req"] = run / 1000 / max(1, len(tags))
            by_thread: dict[str, list[float]] = {}
            for b in mine:
                for t, (on_core, waited) in b["sched"][who].items():
                    name = dumps[who]["threads"].get(str(t), "loop" if str(t) == tid else f"tid {t}")
                    totals_ms = by_thread.setdefault(name, [0.0, 0.0])
                    totals_ms[0] += on_core / 1e6
                    totals_ms[1] += waited / 1e6
            row[f"{who}_threads_ms_on_core_waiting"] = {k: [round(v[0], 1), round(v[1], 1)] for k, v in by_thread.items()
                                                        if v[0] + v[1] >= 1}  # fmt: skip
            row[f"{who}_wait_per_s_blocks"] = [
                round(b["sched"][who].get(int(tid), [0, 0])[1] / 1e6, 2) for b in mine
            ]
        if target != "direct":
            d = dumps[target]
            spans = [
                (client["cs"][t], client["cd"][t]) for t in top if t in client["cs"] and t in client["cd"]
            ]

            def hits(items, spans=spans):
                return sum(
                    any(s <= it[0] <= e or it[0] <= s <= it[0] + it[1] for it in items) for s, e in spans
                )

            in_blocks = [(b["start"], b["end"]) for b in mine]

            def during(items, in_blocks=in_blocks):
                return [it for it in items if any(s <= it[0] <= e for s, e in in_blocks)]

            row["gc_in_blocks"] = [(round(i[1] * 1000, 3), i[2], i[3]) for i in during(d["gc"])]
            row["top1_with_gc"] = hits(during(d["gc"]))
            row["slow_in_blocks"] = [(round(i[1] * 1000, 2), i[2]) for i in during(d["slow"])][:30]
            row["top1_with_slow_callback"] = hits(during(d["slow"]))
            jobs = during(d["jobs"])
            row["jobs_in_blocks"] = {}
            for j in jobs:
                row["jobs_in_blocks"].setdefault(j[2], []).append(round(j[1] * 1000, 2))
            row["top1_with_job"] = hits(jobs)
            row["top1"] = [{"tag": t, **{k: round(v, 2) for k, v in legs[t].items()}} for t in top][-12:]
        report[target] = row
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probed"]:  # --probed NAME DIR CALLBACKS MODULE ARGS...: a measured process
        name, out, callbacks, module = argv[1:5]
        install_probe(name, Path(out), callbacks=callbacks == "1")
        sys.argv = [module, *argv[5:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per target")
    parser.add_argument("--hogs", type=int, default=0, help="busy processes beside the measurement")
    parser.add_argument("--callbacks", action="store_true", help="also time every loop callback (slower)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from bench.gateway import CHAT_BODY, _free_port, _wait_http, bench_upstreams, gateway_env, process
    from infermeter.db import get_engine
    from infermeter.settings import Settings
    from infermeter.stack.local import open_stack
    from infermeter.stack.postgres import remove_scratch
    from serving.keys import KeyStore

    work = Path(tempfile.mkdtemp(prefix="bench-gateway-tail-"))
    out = work / "probe"
    out.mkdir()
    prefix = f"tail{os.getpid()}"
    settings = Settings(INFERMETER_HOME=work / "home", INFERMETER_TOPIC_PREFIX=prefix)
    python = sys.executable
    flag = "1" if args.callbacks else "0"

    def probed(name: str, module: str, *rest: str) -> list[str]:
        return [python, "-m", "bench.gateway_tail", "--probed", name, str(out), flag, module, *rest]

    load = [Path("/proc/loadavg").read_text().split()[:3]]
    try:
        with open_stack(settings) as stack, contextlib.ExitStack() as procs:
            _key_id, token = KeyStore(get_engine(stack.database_url), settings).create("bench-customer")
            stub_port, gw_port, mf_port = _free_port(), _free_port(), _free_port()
            stub_url = f"http://127.0.0.1:{stub_port}"
            env = gateway_env(stack, work / "home", prefix)
            stub = procs.enter_context(process(probed("stub", "bench.gateway", "--stub", str(stub_port)),
                                               log=work / "stub.log"))  # fmt: skip
            _wait_http(stub_url + "/v1/models", process=stub)
            upstreams = bench_upstreams(work / "upstreams.yaml", stub_url, 2, None)
            gw = procs.enter_context(process(
                probed("gateway", "serving.cli", "gateway", "--upstreams", str(upstreams), "--port", str(gw_port)),
                env={**env, "INFERMETER_ACK": "broker", "INFERMETER_GATEWAY_ID": f"bench-{prefix}-gw"},
                log=work / "gateway.log"))  # fmt: skip
            metered = procs.enter_context(process(
                probed("metered", "bench.gateway", "--metered-passthrough", str(mf_port), stub_url),
                env={**env, "INFERMETER_GATEWAY_ID": f"bench-{prefix}-metered"}, log=work / "metered.log"))  # fmt: skip
            _wait_http(f"http://127.0.0.1:{gw_port}/health", process=gw)
            _wait_http(f"http://127.0.0.1:{mf_port}/health", process=metered)
            targets = [("direct", stub_url + "/v1/chat/completions", {}),
                       ("gateway", f"http://127.0.0.1:{gw_port}/v1/chat/completions",
                        {"Authorization": f"Bearer {token}"}),
                       ("metered", f"http://127.0.0.1:{mf_port}/v1/chat/completions", {})]  # fmt: skip
            pids = {"gateway": gw.pid, "metered": metered.pid, "stub": stub.pid}
            hogs = [subprocess.Popen([python, "-c", "while True: pass"]) for _ in range(args.hogs)]
            try:
                time.sleep(1.0)
                load.append(Path("/proc/loadavg").read_text().split()[:3])
                _EVENTS.clear()
                probe = probe_loop(asyncio.SelectorEventLoop)  # the bench's client loop, stamped
                with asyncio.Runner(loop_factory=probe) as runner:
                    run = runner.run(open_loop(targets, args.rate, args.duration, pids, CHAT_BODY))
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            load.append(Path("/proc/loadavg").read_text().split()[:3])
            for proc in (gw, metered, stub):
                proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 30
            names = ("gateway", "metered", "stub")
            while not all((out / f"{n}.json").exists() for n in names) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # the files written whole
            dumps = {n: json.loads((out / f"{n}.json").read_text()) for n in names}
    finally:
        remove_scratch(work)
    report = {"load": load, "rate": args.rate, "hogs": args.hogs, "callbacks": args.callbacks,
              "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "targets": analyse(dumps, run["blocks"], _EVENTS),
              "threads": {n: d["threads"] for n, d in dumps.items()}}  # fmt: skip
    for name, row in report["targets"].items():
        print(f"\n== {name}: {row['requests']} requests, p50 {row['p50']:.2f} p99 {row['p99']:.2f} "
              f"p99.9 {row['p99.9']:.2f} ms")  # fmt: skip
        print("  legs, median request:", {k: round(v, 3) for k, v in row["median_legs"].items()})
        print("  legs, top 1% (mean):  ", {k: round(v, 3) for k, v in row["top1_legs"].items()})
        print("  top 1%, leg furthest above the median's:", row["top1_largest_leg"])
        print(
            "  top 1%, position in its block (0: the block's first request):", row["top1_position_in_block"]
        )
        print(f"  without each block's first 3 requests: p99 {row['steady_p99']:.2f} ms; top 1% legs (mean):",
              {k: round(v, 3) for k, v in row["steady_top1_legs"].items()})  # fmt: skip
        print("  each block's first request, ms:", row["block_starts"])
        for who in ("gateway", "metered", "stub"):
            print(f"  {who} loop thread: run-queue wait {row[f'{who}_loop_wait_us_per_req']:.1f} us/req "
                  f"({row[f'{who}_loop_wait_ms_per_s']:.1f} ms/s; by block {row[f'{who}_wait_per_s_blocks']}), "
                  f"on core {row[f'{who}_loop_cpu_us_per_req']:.0f} us/req")  # fmt: skip
        for who in ("gateway", "metered"):
            print(f"  {who}'s threads over these blocks, ms on a core / ms runnable waiting:",
                  row[f"{who}_threads_ms_on_core_waiting"])  # fmt: skip
        for key in (
            "gc_in_blocks",
            "top1_with_gc",
            "slow_in_blocks",
            "top1_with_slow_callback",
            "jobs_in_blocks",
            "top1_with_job",
            "top1",
        ):
            if key in row:
                print(f"  {key}: {row[key]}")
    print(f"\nload {load}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
