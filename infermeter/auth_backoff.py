"""The policy of the backoff on failed authentication, per client address (the pages' and the API's
middleware, dashboards/web/backoff.py, and the gateway's key check apply it): a client's first
INFERMETER_AUTH_FAILURES_ALLOWED failures cost nothing; each further one makes it wait before it may
present credentials again, 1 s, then 2, 4, 8 ... s, at most INFERMETER_AUTH_BACKOFF_MAX_S (0: off). A
client without a failure for twice the longest wait starts again from nothing. Kept in memory, per
process, keyed by the client, never by the key or the customer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_MAX_CLIENTS = 100_000


@dataclass
class _Failures:
    count: int
    last: float  # when the last failure was answered (the clock's seconds)
    wait_until: float


class FailedAuthentications:
    """The failures of each client and the wait they impose (the policy above, on `clock`)."""

    def __init__(self, *, allowed: int, max_wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed, self.max_wait_s, self._clock = allowed, max_wait_s, clock
        self._clients: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.max_wait_s > 0

    @property
    def any_failed(self) -> bool:
        """Whether any client has a failure on record (while none has, there is nothing to look up)."""
        return bool(self._clients)

    def wait_s(self, client: str) -> float:
        """Seconds the client must still wait before presenting credentials (0: it may now)."""
        found = self._clients.get(client)
        return 0.0 if found is None else max(0.0, found.wait_until - self._clock())

    def failed(self, client: str) -> None:
        """One more failed authentication of the client."""
        now = self._clock()
        with self._lock:
            found = self._clients.get(client)
            if found is None or now - found.last > 2 * self.max_wait_s:  # a fresh start after a quiet spell
                if len(self._clients) >= _MAX_CLIENTS:
                    self._forget_quiet(now)
                found = self._clients[client] = _Failures(0, now, now)
            found.count += 1
            found.last = now
            beyond = found.count - self.allowed
            if beyond > 0:
                found.wait_until = now + min(self.max_wait_s, 2.0 ** min(beyond - 1, 62))

    def _forget_quiet(self, now: float) -> None:
        quiet = [c for c, f in self._clients.items() if now - f.last > 2 * self.max_wait_s]
        for client in quiet:
            del self._clients[client]
        if len(self._clients) >= _MAX_CLIENTS:  # a flood of addresses: start over rather than grow
            self._clients.clear()

    @classmethod
    def of(cls, settings, *, clock: Callable[[], float] = time.monotonic) -> FailedAuthentications:
        """The policy of INFERMETER_AUTH_FAILURES_ALLOWED and INFERMETER_AUTH_BACKOFF_MAX_S."""
        return cls(allowed=settings.auth_failures_allowed, max_wait_s=settings.auth_backoff_max_s, clock=clock)

    def message(self, retry_after_s: int) -> str:
        return (f"Too many failed sign-ins or API keys from your address: try again in {retry_after_s} s "
                "(each further failure doubles the wait).")
