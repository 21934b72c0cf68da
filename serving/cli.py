"""The `infermeter serving ...` commands."""

import typer

app = typer.Typer(help="serving commands", no_args_is_help=True)
