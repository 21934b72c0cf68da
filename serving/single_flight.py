"""One database lookup at a time per key, in a worker thread, for the gateway's caches.

The gateway caches what it reads per request (API keys, serving/keys.py; customers without limits,
serving/budgets.py; regions, serving/residency.py) for a few seconds. Without this, when an entry
expires every request that arrives before the new value is read does its own lookup; and every
request that finds it expired waits for the database.

    flights = SingleFlight("api keys")
    value = await flights.run(key, fn, *args)   # fn(*args) in a thread; callers of the same key share it
    flights.refresh(key, fn, *args)             # the same in the background (nobody waits; errors logged)

Caches call `refresh` when an entry is in the last REFRESH_SHARE of its lifetime: the new value
usually arrives before the entry expires, so the requests of a steady customer never wait for the
database, and an entry is still never used past its expiry (revocations keep their delay).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("serving.gateway")

REFRESH_SHARE = 0.25  # refresh an entry once this share of its lifetime is left


def due(expires_at: float, ttl_s: float, now: float) -> bool:
    """Whether an entry still valid at `now` is due for a background refresh."""
    return expires_at - now < ttl_s * REFRESH_SHARE


class SingleFlight:
    def __init__(self, what: str) -> None:
        self.what = what
        self._flights: dict[Hashable, asyncio.Future] = {}

    def _start(self, key: Hashable, fn: Callable[..., Any], args: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is None or flight.get_loop() is not loop:  # another loop's (tests run several in turn)
            flight = loop.run_in_executor(None, fn, *args)
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        return flight

    def _landed(self, key: Hashable, flight: asyncio.Future) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled() and (error := flight.exception()) is not None:  # retrieved: never "unretrieved"
            log.debug("lookup of %s failed: %s", self.what, error)

    async def run(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) in a worker thread, or the lookup of `key` already under way: its result or error."""
        return await asyncio.shield(self._start(key, fn, args))

    def refresh(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        """Start fn(*args) in the background unless a lookup of `key` is under way."""
        if key not in self._flights:
            self._start(key, fn, args)


__all__ = ["REFRESH_SHARE", "SingleFlight", "due"]
