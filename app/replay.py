"""`infermeter replay`: the whole serving pipeline on a real trace, in one command.

Starts what is missing (the local stack, vLLM CPU replicas of the tiny model, a metering consumer,
the gateway), replays the trace through the gateway once per routing policy from cold caches, and
compares what metering recorded with vLLM's own counters (serving.replay has the trace, the load
generator and the counters).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from infermeter.db import get_engine
from infermeter.settings import get_settings
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url
from metering.consumer import MeteringConsumer, run_in_thread
from metering.event_lookups import request_event_totals
from serving.gateway import build_gateway, serve_in_thread
from serving.keys import KeyStore
from serving.replay import (
    ReplayError,
    ReplayReport,
    ReplayRequest,
    ReplayResult,
    load_trace,
    per_replica_cached,
    reconcile,
    reset_prefix_caches,
    run_replay,
    scale_trace,
    trace_path,
    vllm_counters,
)
from serving.tinymodel import SERVED_NAME, ensure_tiny_model
from serving.upstreams import parse_upstreams
from serving.vllm_server import home_cache_dir, resolve_python, start_vllm

console = Console(stderr=True)
replay_app = typer.Typer(help="Replay a real traffic trace through the gateway.", no_args_is_help=True)


def _fail(message: str, code: int = 1) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def metered_totals(database_url: str, report: ReplayReport, timeout_s: float = 60.0) -> dict[str, int]:
    """What metering recorded for the replay's request ids, once every one has landed (or the timeout)."""
    ids = [r.request_id for r in report.results if r.request_id]
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        while True:
            totals = request_event_totals(conn, ids)
            if totals["events"] >= len(ids) or time.monotonic() > deadline:
                return totals
            time.sleep(0.2)


@dataclass
class PolicyRun:
    routing: str
    report: ReplayReport
    pairs: dict[str, tuple[int, int]]
    per_replica: dict[str, dict[str, int]]

    @property
    def cached_share(self) -> float:
        prompt = self.pairs["prompt_tokens"][1]
        return self.pairs["cached_tokens"][1] / prompt if prompt else 0.0


def replay_pipeline(
    settings,
    requests: list[ReplayRequest],
    *,
    routings: list[str],
    replicas: int = 1,
    upstreams: list[str] | None = None,
    progress: Callable[[str], None] = print,
    on_done: Callable[[ReplayResult], None] | None = None,
    kv_cache_bytes: int | None = None,
) -> list[PolicyRun]:
    """Start what is missing (stack, vLLM replicas, metering consumer, gateway), replay the trace
    through the gateway once per routing policy from cold caches, and reconcile each run."""
    runs: list[PolicyRun] = []
    with open_stack(settings) as stack, contextlib.ExitStack() as cleanup:
        settings = settings.model_copy(
            update={"database_url": stack.database_url, "kafka_bootstrap": stack.kafka_bootstrap}
        )
        # The metering consumer first: its group join happens while the replicas boot.
        consumer = MeteringConsumer(settings, stack.database_url, stack.kafka_bootstrap)
        thread = run_in_thread(consumer)
        cleanup.callback(thread.join, 30)
        cleanup.callback(consumer.stop)
        urls = list(upstreams or [])
        if not urls:
            python = resolve_python(settings.vllm_python)
            progress("building the tiny model (first use only)")
            model_dir = ensure_tiny_model(Path(settings.home) / "models", python)
            servers = []
            for n in range(replicas):
                state_dir = Path(tempfile.mkdtemp(prefix=f"replay-vllm-{n}-", dir=Path(settings.home)))
                server = start_vllm(
                    python,
                    str(model_dir),
                    served_model_name=SERVED_NAME,
                    state_dir=state_dir,
                    cache_dir=home_cache_dir(settings.home),
                    dev_mode=True,
                    **({"kv_cache_bytes": kv_cache_bytes} if kv_cache_bytes else {}),
                )
                cleanup.callback(server.stop)
                servers.append(server)
            progress(f"starting {replicas} vLLM replica(s)")
            for server in servers:
                server.wait_ready()
            urls = [server.url for server in servers]
        customer = f"replay-{int(time.time())}"
        _key_id, token = KeyStore(get_engine(stack.database_url), settings).create(customer)
        for routing in routings:
            if len(routings) > 1 or not upstreams:
                with contextlib.suppress(OSError):
                    reset_prefix_caches(urls)
            config = parse_upstreams(
                {
                    "models": [
                        {
                            "name": SERVED_NAME,
                            "deployment_id": "replay",
                            "routing": routing,
                            "replicas": [{"id": f"replay-{n}", "url": url} for n, url in enumerate(urls)],
                        }
                    ]
                }
            )
            served = serve_in_thread(build_gateway(settings, upstreams=config))
            try:
                progress(f"replaying {len(requests)} requests through the gateway ({routing} routing)")
                before = [vllm_counters([url]) for url in urls]
                report = run_replay(
                    requests,
                    base_url=served.url,
                    model=SERVED_NAME,
                    vllm_urls=urls,
                    api_key=token,
                    on_done=on_done,
                )
                per_replica = per_replica_cached(urls, before)
                progress("waiting for metering to record every request")
                pairs = reconcile(report, metered_totals(stack.database_url, report))
            finally:
                served.stop()
            runs.append(PolicyRun(routing=routing, report=report, pairs=pairs, per_replica=per_replica))
    return runs


@replay_app.callback(invoke_without_command=True)
def replay(
    trace: str = typer.Option(
        "mooncake", help="mooncake (bundled) or a path to a Mooncake-format JSONL trace."
    ),
    through_gateway: bool = typer.Option(
        True,
        "--through-gateway/--direct",
        help="Send through the metering gateway (default) or straight to vLLM.",
    ),
    limit: int = typer.Option(200, help="Requests to replay (from the start of the trace, after --offset)."),
    offset: int = typer.Option(0, help="Trace lines to skip."),
    speedup: float = typer.Option(4.0, help="Arrival times are divided by this."),
    max_blocks: int = typer.Option(48, help="Hash blocks kept per prompt (32 tokens each; context is 2048)."),
    routing: str = typer.Option("prefix", help="prefix, round_robin, or both (compare from cold caches)."),
    replicas: int = typer.Option(1, help="vLLM replicas to start (tiny model) when no --upstream is given."),
    upstream: list[str] = typer.Option(
        [], help="Existing vLLM replica URL (repeatable) instead of starting some."
    ),
    kv_cache_mib: int = typer.Option(
        64, help="KV cache per started replica, MiB (64 MiB = 32k tokens here)."
    ),
) -> None:
    """Replay a real trace at scaled arrival times and reconcile metered tokens with vLLM's counters."""
    policies = ["prefix", "round_robin"] if routing == "both" else [routing]
    if any(p not in ("prefix", "round_robin") for p in policies):
        _fail("--routing must be prefix, round_robin or both")
    try:
        requests = scale_trace(
            load_trace(trace_path(trace), limit=limit, offset=offset), speedup=speedup, max_blocks=max_blocks
        )
    except ReplayError as exc:
        _fail(str(exc))
    span = requests[-1].send_at_s
    console.print(f"{len(requests)} requests over {span:.1f} s (speedup {speedup:g}) from {trace}")
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("replay", total=len(requests) * len(policies))

        def done(_result) -> None:
            progress.advance(task)

        try:
            if not through_gateway:
                if not upstream:
                    _fail("--direct needs --upstream URL (a running vLLM)")
                report = run_replay(
                    requests, base_url=upstream[0], model="tiny-llama", vllm_urls=upstream, on_done=done
                )
                totals = report.client_totals()
                console.print(
                    f"direct: {len(report.ok)}/{len(requests)} ok, {totals}, vLLM deltas {report.vllm_delta}"
                )
                return
            runs = replay_pipeline(
                get_settings(), requests, routings=policies, replicas=replicas, upstreams=upstream or None,
                progress=lambda text: progress.update(task, description=text), on_done=done,
                kv_cache_bytes=kv_cache_mib * 1024 * 1024,
            )  # fmt: skip
        except ReplayError as exc:
            _fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - one clear line, no traceback
            _fail(f"replay failed: {type(exc).__name__}: {exc}")
    table = Table(title="metered by the pipeline vs counted by vLLM")
    for column in (
        "routing",
        "requests ok",
        "prompt tokens",
        "cached tokens",
        "output tokens",
        "cached share",
        "match",
    ):
        table.add_column(column, justify="right")
    mismatch = False
    for run in runs:
        pairs = run.pairs
        same = all(metered == counted for name, (metered, counted) in pairs.items() if name != "requests")
        mismatch |= not same
        cell = lambda pair: f"{pair[0]} / {pair[1]}"  # noqa: E731
        table.add_row(
            run.routing, f"{len(run.report.ok)}/{len(run.report.results)}", cell(pairs["prompt_tokens"]),
            cell(pairs["cached_tokens"]), cell(pairs["output_tokens"]), f"{run.cached_share:.1%}",
            "yes" if same else "NO",
        )  # fmt: skip
    Console().print(table)
    for run in runs:
        for url, counters in run.per_replica.items():
            console.print(f"  {run.routing}: {url} {counters}")
        failed = [r for r in run.report.results if r.status != 200 or r.error]
        if failed:
            reasons = sorted({f"{r.status}: {(r.error or '')[:160]}" for r in failed})
            console.print(
                f"  {run.routing}: {len(failed)} request(s) failed (metered as errors): {reasons[:3]}"
            )
    if mismatch:
        raise typer.Exit(1)
