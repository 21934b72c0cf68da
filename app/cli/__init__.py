"""`infermeter`: one CLI for the whole project (`infermeter --help`).

Commands that need PostgreSQL or the broker use the configured ones (DATABASE_URL,
KAFKA_BOOTSTRAP), else the stack of a running `infermeter up`, else start the embedded parts for
their own duration. Errors print one clear line and exit with status 2 (1 for a failed check).

This module builds the command tree and runs it (`main`); the commands live by job:
- `app.cli.up`: `up` (the whole local stack in the foreground) and `api` (the HTTP API alone);
- `app.cli.setup`: `settings` and `db upgrade|check`;
- `app.cli.events`: `events ingest|dead-letters`;
- `app.cli.meter`: `metering run|rebuild-totals|archive`;
- `app.cli.reads`: `usage`, `tasks`, `reconcile`;
- `app.cli.demo`: `demo`;
- `app.cli.common`: the consoles, the one-line error, JSON output and progress bars they share.
The other packages' command groups are mounted by `_mount_optional_apps`.
"""

from __future__ import annotations

import sys

import psycopg
import typer

from app.cli import demo, events, meter, reads, setup, up
from app.cli.common import CliError, err_console
from infermeter.stack import StackError

app = typer.Typer(
    help="infermeter: token-and-task metering and billing for LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(setup.db_app, name="db")
app.add_typer(events.app, name="events")
app.add_typer(meter.app, name="metering")
app.command()(up.up)
app.command("settings")(setup.show_settings)
app.command("api")(up.serve_api)
app.command()(reads.usage)
app.command()(reads.tasks)
app.command()(reads.reconcile)
app.command()(demo.demo)


def _mount_pricing() -> None:
    from pricing_service.cli import app as pricing_cli
    from pricing_service.cli import cost_app

    app.add_typer(pricing_cli, name="pricing")
    app.add_typer(cost_app, name="cost")


def _mount_predictions() -> None:
    from prediction_service.cli import app as predict_cli
    from prediction_service.cli import quote_command

    app.add_typer(predict_cli, name="predict")
    app.command("quote")(quote_command)


def _mount_alerts() -> None:
    from alerts.cli import app as alerts_cli

    app.add_typer(alerts_cli, name="alerts")


def _mount_serving() -> None:
    from serving.capacity_api import capacity_command
    from serving.cli import bench_app, serve_app
    from serving.control_cli import budgets_app, keys_app

    app.add_typer(serve_app, name="serve")
    app.add_typer(bench_app, name="bench")
    app.add_typer(keys_app, name="keys")
    app.add_typer(budgets_app, name="budgets")
    app.command("capacity")(capacity_command)
    serve_app.command("dashboards")(_serve_dashboards())


def _mount_replay() -> None:
    from app.replay import replay_app

    app.add_typer(replay_app, name="replay")


def _mount_billing() -> None:
    from billing_service.cli import APPS as billing_apps
    from serving.residency_api import residency_command

    # customers, plans, billing, invoices, invoice, credits, stripe (sync, status), export (finance exports)
    for name, billing_group in billing_apps.items():
        app.add_typer(billing_group, name=name)
    # `customers residency`: the store is serving's (the gateway reads it), the group billing's
    billing_apps["customers"].command("residency")(residency_command)


# The other packages' command groups, by the top-level names they add. A command line that names one
# of them mounts only its group (each group's imports cost a few hundred ms of start-up, all of them
# together about 1 s); the command tree's own commands (`usage`, `metering run`, ...) mount none;
# help, and anything else, mounts them all.
_OPTIONAL_GROUPS = {
    _mount_pricing: ("pricing", "cost"),
    _mount_predictions: ("predict", "quote"),
    _mount_alerts: ("alerts",),
    _mount_serving: ("serve", "bench", "keys", "budgets", "capacity"),
    _mount_replay: ("replay",),
    _mount_billing: ("customers", "plans", "billing", "invoices", "invoice", "credits", "stripe", "export"),
}
_GROUP_OF = {name: mount for mount, names in _OPTIONAL_GROUPS.items() for name in names}
_mounted: set = set()


def _mount_optional_apps(argv: list[str] | None = None) -> None:
    """Mount the other packages' command groups that the command line `argv` (its arguments, without
    the program's name) needs; with None, all of them. Imported here, not at module load, to keep
    start-up light."""
    first = next((arg for arg in argv or () if not arg.startswith("-")), None)
    if first in _GROUP_OF:
        wanted = [_GROUP_OF[first]]
    elif first is not None and first in _core_names():
        wanted = []
    else:  # help, or a name no group has: the whole tree (its error lists every command)
        wanted = list(_OPTIONAL_GROUPS)
    for mount in wanted:
        if mount not in _mounted:
            mount()
            _mounted.add(mount)


def _core_names() -> set[str]:
    """The names of the command tree's own commands and groups."""
    commands = {info.name or info.callback.__name__ for info in app.registered_commands}
    return commands | {info.name for info in app.registered_groups}


def _serve_dashboards():
    """`infermeter serve dashboards`, with the serving key store dashboards may not import itself."""
    from dashboards.cli import serve_command

    def key_store(settings, database_url):
        from infermeter.db import get_engine
        from serving.keys import KeyStore

        return KeyStore(get_engine(database_url), settings=settings)

    def billing(settings, database_url):  # billing's sections of the pages
        from app.api import dashboard_billing

        return dashboard_billing(settings, database_url)

    def predictions(settings, database_url):  # the predictors' and the alerts' sections of the pages
        from app.api import dashboard_predictions

        return dashboard_predictions(settings, database_url)

    return serve_command(key_store, billing, predictions)


def main() -> None:
    from metering.kafka_types import KafkaError
    from metering.queries import QueryError

    _mount_optional_apps(sys.argv[1:])
    from alembic.util.exc import CommandError

    known = (CliError, StackError, KafkaError, QueryError, CommandError, psycopg.OperationalError, FileNotFoundError,
             TimeoutError, RuntimeError, ValueError)
    try:
        app()
    except known as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        err_console.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)

