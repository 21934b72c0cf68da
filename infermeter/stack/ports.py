"""Loopback ports: a free one, waiting until something listens, checking one can be listened on."""

from __future__ import annotations

import contextlib
import errno
import socket
import time

from infermeter.stack import StackError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise StackError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s")


def check_listen_port(host: str, port: int, setting: str) -> None:
    """StackError, one line naming the port and `setting` (what sets it), unless `host:port` can be
    listened on now: commands that serve HTTP check their ports before starting anything, instead of
    failing in uvicorn after the rest of the stack started. The port is bound and released at once,
    with SO_REUSEADDR as uvicorn binds it (a port whose last connections are in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StackError(f"port {port} on {host} ({setting}) is already in use: stop what listens "
                                 f"there or set {setting} to a free port") from None
            raise StackError(f"cannot listen on {host}:{port} ({setting}): {exc.strerror or exc}") from None
