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


# The signals the active guard's handler took, in order. Python runs a handler between any two
# bytecodes, also inside a `__del__` or a weakref callback that the garbage collector called, and
# an exception raised there is printed ("Exception ignored in ...") and dropped: the `Stopped` is
# lost though the handler ran (CI: `up` ignored a SIGTERM that came while it built its API). The
# waits below raise it again from this record.
_taken: list[int] = []


def raise_if_signalled() -> None:
    """Raise `Stopped` if the active `stop_on_signals` took a signal (its own raise may have been lost)."""
    if _taken:
        raise Stopped(_taken[0])


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_SignalGuard]:
    """SIGINT, SIGTERM and SIGHUP raise `Stopped` (a KeyboardInterrupt) in the main thread, once.

    So a terminal closing, `kill` or a service manager get the same clean shutdown as Ctrl-C:
    every `finally` runs, then atexit. Set `guard.stopping = True` when clean-up begins (a
    signal raising inside it would cut it short); later signals are then ignored. Main thread only.
    """
    guard = _SignalGuard()
    _taken.clear()

    def handler(signum: int, _frame: object) -> None:
        if guard.stopping:
            return
        guard.stopping = True
        _taken.append(signum)
        raise Stopped(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield guard
    finally:
        guard.stopping = True
        for sig, old in previous.items():
            signal.signal(sig, old)
        _taken.clear()


def wait_for_signal(poll_s: float = 1.0) -> None:
    """Block the main thread until a signal handler raises (inside `stop_on_signals`: `Stopped`).

    Not `signal.pause()`: Python runs a handler only between bytecodes, so a signal that arrives
    after the interpreter's last check and before the pause(2) call (a window of milliseconds when
    this thread is preempted there, e.g. by the thread that releasing the GIL woke) leaves pause()
    waiting for a second signal, so a SIGTERM could be ignored. A timed sleep returns, and the
    pending handler runs, within `poll_s` either way; a signal whose `Stopped` was lost (see
    `_taken`) stops the wait at the next poll too (tests/cli/test_signals.py)."""
    while True:
        raise_if_signalled()
        time.sleep(poll_s)


def serve_http(app: object, **config: object) -> None:
    """`uvicorn.run`, with SIGHUP shutting the server down gracefully like SIGINT and SIGTERM.

    Inside `stop_on_signals`, the signal that stopped the server is re-raised by uvicorn once it
    has shut down, so `Stopped` comes out of this call and the caller's clean-up runs.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, **config))
    taken: list[int] = []

    def on_signal(sig: int, _frame: object) -> None:
        # Until uvicorn installs its own handlers (and for SIGHUP, which it does not handle): no raise
        # that could be lost inside the event loop's start, a graceful shutdown as for SIGTERM.
        taken.append(sig)
        server.should_exit = True

    raise_if_signalled()  # a signal before uvicorn took over whose `Stopped` was lost: do not start
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        server.run()  # re-raises the signal that stopped it once it has shut down: `on_signal` takes it
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    for sig in dict.fromkeys(taken):
        signal.raise_signal(sig)  # to the caller's handler (inside `stop_on_signals`: `Stopped`)
    raise_if_signalled()  # that raise was lost
    if not server.started:
        sys.exit(3)  # uvicorn's own exit status when it cannot start (port in use...): it logged why
