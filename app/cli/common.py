"""What the commands share: the two consoles, the one-line error, JSON output and progress bars."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

console = Console()
err_console = Console(stderr=True)


class CliError(Exception):
    """An error to print as one line (exit 2)."""


def print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass


def progress_display(quiet: bool):
    if quiet:
        return _NoProgress()
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"),
                    TimeElapsedColumn(), console=err_console, transient=True)
