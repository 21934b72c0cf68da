"""CLI of the serving control plane: API keys, budgets and rate limits, the replica agent.

- `keys_app` (mounted by the lead as `infermeter keys`): `create`, `list`, `revoke`.
- `budgets_app` (mounted as `infermeter budgets`): `set`, `show`, `list`, `clear`.
- `replica_agent` (mounted as `infermeter serve replica-agent`; `register_serve_commands(app)`
  adds it to the gateway engineer's `serve` app).

Errors print one line and exit with status 2; no tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import Iterator
from decimal import Decimal
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infermeter.settings import get_settings
from infermeter.times import utc_text
from pricing.money import plain_decimal

console = Console()
err_console = Console(stderr=True)

keys_app = typer.Typer(help="Customer API keys (shown once, stored hashed).", no_args_is_help=True)
budgets_app = typer.Typer(help="Per-customer monthly budgets and RPM/TPM rate limits.", no_args_is_help=True)


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", soft_wrap=True)  # one line, whatever the terminal's width
    raise typer.Exit(2)


@contextlib.contextmanager
def _engine() -> Iterator:
    from sqlalchemy.exc import SQLAlchemyError

    from infermeter.db import get_engine
    from infermeter.stack import StackError
    from infermeter.stack.local import open_stack

    try:
        with open_stack(get_settings(), broker=False) as stack:
            yield get_engine(stack.database_url)
    except StackError as exc:
        _fail(str(exc))
    except SQLAlchemyError as exc:
        _fail(f"database error: {str(exc).splitlines()[0]}")


# --- keys ----------------------------------------------------------------------------------------


@keys_app.command("create")
def keys_create(
    customer: Annotated[str, typer.Option("--customer", help="Customer id the key acts for.")],
    project: Annotated[str | None, typer.Option("--project", help="Optional project id.")] = None,
) -> None:
    """Create a key; its secret is printed once and never stored."""
    from serving.keys import KeyStore

    with _engine() as engine:
        key_id, token = KeyStore(engine).create(customer, project)
    console.print(f"key id:  {key_id}")
    console.print(f"secret:  {token}")
    err_console.print("[yellow]Store the secret now: it is shown only once.[/yellow]")


@keys_app.command("list")
def keys_list(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    project: Annotated[str | None, typer.Option("--project", help="Only this project's keys.")] = None,
) -> None:
    """List a customer's keys (never their secrets)."""
    from serving.keys import KeyStore

    with _engine() as engine:
        keys = KeyStore(engine).list(customer)
    if project is not None:
        keys = [k for k in keys if k.project_id == project]
    table = Table("key id", "project", "prefix", "created", "status")
    for key in keys:
        status = "active" if key.active else f"revoked {key.revoked_at:%Y-%m-%d %H:%M:%S}Z"
        table.add_row(key.key_id, key.project_id or "", key.display_prefix, f"{key.created_at:%Y-%m-%d %H:%M:%S}Z", status)
    console.print(table if keys else f"no keys for customer {customer}")


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (from `keys list`).")],
    customer: Annotated[str, typer.Option("--customer", help="Customer id the key belongs to.")],
    project: Annotated[str | None, typer.Option("--project", help="Project id the key belongs to.")] = None,
) -> None:
    """Revoke a key: every gateway refuses it within INFERMETER_KEY_CACHE_TTL_S seconds."""
    from serving.keys import KeyStore

    with _engine() as engine:
        store = KeyStore(engine)
        key = store.get(key_id)
        if key is None or key.customer_id != customer or (project is not None and key.project_id != project):
            _fail(f"no key {key_id} for customer {customer}" + (f" and project {project}" if project else ""))
        if not store.revoke(key_id):
            _fail(f"key {key_id} is already revoked")
    console.print(f"revoked {key_id}")


# --- budgets -------------------------------------------------------------------------------------


def _decimal(value: str | None, what: str) -> Decimal | None:
    if value is None:
        return None
    try:
        amount = plain_decimal(value, what=what)
    except ValueError as exc:
        _fail(str(exc))
    if amount < 0:
        _fail(f"{what} must be a non-negative decimal number")
    return amount


@budgets_app.command("set")
def budgets_set(
    customer: Annotated[str, typer.Option("--customer", help="Customer id.")],
    monthly_cap: Annotated[str | None, typer.Option("--monthly-cap", help="Spend cap per calendar month (UTC), e.g. 100.00.")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="hard (reject past the cap), soft (warn) or predictive (reject past the cap, reserving each request's predicted p99 output instead of max_tokens).")] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Tokens per minute (prompt + max_tokens).")] = None,
    no_cap: Annotated[bool, typer.Option("--no-cap", help="Remove the spend cap.")] = False,
    no_rpm: Annotated[bool, typer.Option("--no-rpm", help="Remove the RPM limit.")] = False,
    no_tpm: Annotated[bool, typer.Option("--no-tpm", help="Remove the TPM limit.")] = False,
) -> None:
    """Set (or change) a customer's budget and limits; options left out keep their current value."""
    from serving.budgets import MODES, get_budget, set_budget

    if mode is not None and mode not in MODES:
        _fail(f"--mode must be one of {', '.join(MODES)}")
    cap = _decimal(monthly_cap, "--monthly-cap")
    with _engine() as engine:
        current = get_budget(engine, customer)
        config = set_budget(
            engine,
            customer,
            monthly_cap=None if no_cap else (cap if cap is not None else (current.monthly_cap if current else None)),
            mode=mode or (current.mode if current else "hard"),
            rpm=None if no_rpm else (rpm if rpm is not None else (current.rpm if current else None)),
            tpm=None if no_tpm else (tpm if tpm is not None else (current.tpm if current else None)),
        )
    _print_budgets([config])


def _print_budgets(configs, spends=None) -> None:
    table = Table("customer", "monthly cap", "mode", "rpm", "tpm", *(["spent this period"] if spends else []))
    for i, c in enumerate(configs):
        extra = [f"{spends[i].total:.6f}"] if spends else []
        table.add_row(c.customer_id, "none" if c.monthly_cap is None else f"{c.monthly_cap:f}", c.mode,
                      str(c.rpm) if c.rpm is not None else "none", str(c.tpm) if c.tpm is not None else "none", *extra)
    console.print(table)


@budgets_app.command("show")
def budgets_show(customer: Annotated[str, typer.Option("--customer", help="Customer id.")]) -> None:
    """A customer's budget, limits and spend in its current billing period (metered + settled + reserved)."""
    from serving.budgets import AdmissionController, get_budget

    with _engine() as engine:
        config = get_budget(engine, customer)
        if config is None:
            _fail(f"customer {customer} has no budget or rate limit")
        controller = AdmissionController(engine)
        try:
            spend = controller.spend(customer)
        finally:
            controller.close()
    _print_budgets([config], [spend])
    console.print(f"metered {spend.metered:.6f} + settled, not yet metered {spend.settled_unmetered:.6f}"
                  f" + in flight {spend.reserved:.6f}")
    if spend.period is not None:
        console.print(f"billing period {utc_text(spend.period.start)} to {utc_text(spend.period.end)}")


@budgets_app.command("list")
def budgets_list() -> None:
    """Every customer with a budget or a rate limit."""
    from serving.budgets import list_budgets

    with _engine() as engine:
        configs = list_budgets(engine)
    _print_budgets(configs) if configs else console.print("no budgets")


@budgets_app.command("clear")
def budgets_clear(customer: Annotated[str, typer.Option("--customer", help="Customer id.")]) -> None:
    """Remove a customer's budget and limits (unlimited again within INFERMETER_BUDGET_CONFIG_TTL_S)."""
    from serving.budgets import clear_budget

    with _engine() as engine:
        if not clear_budget(engine, customer):
            _fail(f"customer {customer} has no budget")
    console.print(f"cleared the budget of {customer}")


# --- replica agent -------------------------------------------------------------------------------


def replica_agent(
    vllm: Annotated[str, typer.Option("--vllm", help="Base URL of the vLLM server, e.g. http://127.0.0.1:8000.")],
    deployment: Annotated[str, typer.Option("--deployment", help="Deployment id.")],
    gpu_type: Annotated[str, typer.Option("--gpu-type", help="GPU type, e.g. H100 (here: cpu).")],
    gpu_count: Annotated[int, typer.Option("--gpu-count", min=1, help="GPUs held by this replica.")],
    customer: Annotated[str | None, typer.Option("--customer", help="Dedicated deployment of this customer.")] = None,
    replica_id: Annotated[str | None, typer.Option("--replica-id", help="Default: <deployment>@<host>:<port>.")] = None,
    region: Annotated[str | None, typer.Option("--region", help="Where the replica runs (one of INFERMETER_REGIONS).")] = None,
    interval_s: Annotated[float | None, typer.Option("--interval-s", help="Interval length (default INFERMETER_REPLICA_INTERVAL_S).")] = None,
    sample_s: Annotated[float | None, typer.Option("--sample-s", help="Scrape period (default INFERMETER_REPLICA_SAMPLE_S).")] = None,
) -> None:
    """Scrape a vLLM replica's /metrics and emit infermeter.replica.v1 GPU intervals until Ctrl-C."""
    from infermeter.stack.local import running_stack
    from serving.emitter import Emitter
    from serving.replica_agent import ReplicaAgent

    settings = get_settings()
    bootstrap = settings.kafka_bootstrap or ((running_stack(settings) or {}).get("kafka_bootstrap"))
    if not bootstrap:
        _fail("no Kafka broker: set KAFKA_BOOTSTRAP or start the stack with `infermeter up`")
    if not vllm.startswith(("http://", "https://")):
        _fail(f"--vllm must be an http(s) URL, not {vllm!r}")
    if region is not None:
        from serving.upstreams import parse_regions, unknown_regions_error

        try:
            known = parse_regions(settings.regions, what="INFERMETER_REGIONS")
            parse_regions([region], what="--region")
        except ValueError as exc:
            _fail(str(exc))
        if problem := unknown_regions_error((region,), known, what="--region"):
            _fail(problem)
    try:
        agent = ReplicaAgent(
            vllm, deployment, gpu_type, gpu_count, None,  # type: ignore[arg-type] - emitter set below
            customer_id=customer, replica_id=replica_id, region=region,
            interval_s=interval_s or settings.replica_interval_s, sample_s=sample_s or settings.replica_sample_s,
        )
    except ValueError as exc:
        _fail(str(exc))
    spool_name = "replica-agent-" + re.sub(r"[^A-Za-z0-9_.-]", "_", agent.replica_id)
    emitter = Emitter(None, bootstrap, settings, name=spool_name).start()
    agent.emitter = emitter
    err_console.print(
        f"replica agent: {agent.metrics_url} -> {settings.events_topic} as replica {agent.replica_id}"
        f" ({'dedicated to ' + customer if customer else 'shared pool'}), every {agent.interval_s:g} s; Ctrl-C stops"
    )

    def on_interval(event: dict) -> None:
        data = event["data"]
        err_console.print(
            f"{data['interval_start']} .. {data['interval_end']}: busy {data['busy_seconds']} s, "
            f"prompt {data['prompt_tokens']}, generation {data['generation_tokens']} (spool {emitter.depth()})"
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop, on_interval=on_interval)

    try:
        asyncio.run(main())
    finally:
        emitter.wait_drained(5)
        left = emitter.depth()
        emitter.close()
        if left:
            err_console.print(f"{left} interval event(s) stay spooled; the next start publishes them")


def register_serve_commands(serve_app: typer.Typer) -> None:
    """Add `replica-agent` to the `infermeter serve` app."""
    serve_app.command("replica-agent")(replica_agent)
