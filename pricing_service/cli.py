"""The `infermeter pricing ...` commands."""

import typer

app = typer.Typer(help="pricing commands", no_args_is_help=True)
