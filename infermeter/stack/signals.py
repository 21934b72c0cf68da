"""Signals: SIGTERM and SIGHUP give the same clean shutdown as Ctrl-C, uvicorn included."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP inside `stop_on_signals` (Ctrl-C raises it too)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _SignalGuard:
    stopping = False


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_SignalGuard]:
    """SIGINT, SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt) in the main thread, once.

    So a terminal closing, `kill` or a service manager get the same clean shutdown as Ctrl-C:
    every `finally` runs, then atexit. Set `guard.stopping = True` when clean-up begins (a
    signal raising inside it would cut it short); later signals are then ignored. Main thread only.
    """
    guard = _SignalGuard()

    def handler(signum: int, _frame: object) -> None:
        if guard.stopping:
            return
        guard.stopping = True
        raise Stopped(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield guard
    finally:
        guard.stopping = True
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_for_signal(poll_s: float = 1.0) -> None:
    """Block the main thread until a signal handler raises (inside `stop_on_signals`: `Stopped`).

    Not `signal.pause()`: Python runs a handler only between bytecodes, so a signal that arrives
    after the interpreter's last check and before the pause(2) call (a window of milliseconds when
    this thread is preempted there, e.g. by the thread that releasing the GIL woke) leaves pause()
    waiting for a second signal, so a SIGTERM could be ignored. A timed sleep returns, and the
    pending handler runs, within `poll_s` either way (tests/cli/test_signals.py)."""
    while True:
        time.sleep(poll_s)


def serve_http(app: object, **config: object) -> None:
    """`uvicorn.run`, with SIGHUP shutting the server down gracefully like SIGINT and SIGTERM.

    Inside `stop_on_signals`, the signal that stopped the server is re-raised by uvicorn once it
    has shut down, so `Stopped` comes out of this call and the caller's clean-up runs.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, **config))
    hangup: list[int] = []

    def on_hangup(sig: int, _frame: object) -> None:
        hangup.append(sig)
        server.should_exit = True  # uvicorn's graceful shutdown, as for SIGTERM

    previous = signal.signal(signal.SIGHUP, on_hangup)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGHUP, previous)
    if hangup:
        signal.raise_signal(signal.SIGHUP)  # as uvicorn does for SIGINT and SIGTERM
    if not server.started:
        sys.exit(3)  # uvicorn's own exit status when it cannot start (port in use...): it logged why
