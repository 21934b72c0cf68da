"""`infermeter demo`: the month built from the bundled trace, through the full local stack (app.demo)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from app.cli.common import console
from infermeter.settings import get_settings
from infermeter.stack.signals import stop_on_signals


def demo(
    full: Annotated[bool, typer.Option(help="Build the month from the whole trace (12,031 requests, each conversation 3 times).")] = False,
    requests: Annotated[int | None, typer.Option(help="Build the month from the first N requests of the trace (default 4,000; the month holds 3 x N).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of customer, task and retry assignment.")] = 7,
    out: Annotated[Path | None, typer.Option(help="Folder for the demo's reports (default INFERMETER_HOME/demo).")] = None,
    serve: Annotated[bool, typer.Option(help="Then keep the API and the dashboards up until Ctrl-C (or SIGTERM).")] = False,
    host: Annotated[str | None, typer.Option(help="With --serve: bind address (INFERMETER_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="With --serve: port (INFERMETER_API_PORT).")] = None,
) -> None:
    """The main job: a month built from the bundled Mooncake trace, metered through the full local stack, priced and
    invoiced; ends with the dashboards' addresses, a demo customer's API key and the admin sign-in."""
    from app.demo.run import run_demo

    settings = get_settings()
    out_dir = out or settings.home / "demo"
    if not serve:
        run_demo(settings, full=full, limit=requests, seed=seed, out_dir=out_dir, console=console)
        return
    # SIGINT, SIGTERM, SIGHUP: uvicorn shuts down, then the stack this command started stops
    with stop_on_signals(), contextlib.suppress(KeyboardInterrupt):
        run_demo(settings, full=full, limit=requests, seed=seed, out_dir=out_dir, console=console, serve=True,
                 host=host, port=port)
