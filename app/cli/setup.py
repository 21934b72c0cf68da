"""`infermeter settings` (every setting) and `infermeter db upgrade|check` (the schema)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from app.cli.common import console, err_console
from infermeter.settings import get_settings
from infermeter.settings_doc import settings_table
from infermeter.stack.local import open_stack

db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)


def show_settings() -> None:
    """Every setting: its environment variable, default and meaning."""
    table = Table("variable", "default", "meaning")
    for row in settings_table():
        table.add_row(*row)
    console.print(table)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "heads") -> None:
    """Apply Alembic migrations (automatic for the embedded database)."""
    from infermeter.db import upgrade

    settings = get_settings()
    with open_stack(settings, broker=False, migrate=False) as stack:
        upgrade(stack.database_url, revision)
        console.print(f"database at {revision}")


@db_app.command("check")
def db_check() -> None:
    """Fail if the models and the migrations disagree (autogenerate would produce changes)."""
    from infermeter.db import drift
    from migrations.models import target_metadata

    settings = get_settings()
    with open_stack(settings, broker=False) as stack:
        changes = drift(stack.database_url, target_metadata())
    if changes:
        for change in changes:
            err_console.print(f"drift: {change}")
        raise typer.Exit(1)
    console.print("models and migrations agree")
