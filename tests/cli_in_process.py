"""`infermeter ...` run in the test's own process through app.cli.main, its exit code and output
captured: what the `cli` fixtures of billing and the predictors call."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(monkeypatch, capsys, *args: str) -> CliResult:
    """`infermeter *args` with the current environment; a SystemExit becomes the exit code."""
    from app import cli as app_cli

    monkeypatch.setattr(sys, "argv", ["infermeter", *args])
    code = 0
    capsys.readouterr()
    try:
        app_cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)
