"""Per-client backoff on failed authentication: an ASGI middleware in front of the pages (and the API).

A request *presents credentials* when it carries an `Authorization` header (a bearer API key, the
admin or producer token) or posts a sign-in form (`POST /signin`, `POST /admin/signin`). An answer of
401 to such a request is a failed authentication of its client: the address the connection came
from (as uvicorn sees it; behind a proxy, run uvicorn with proxy headers so that it is the caller's).

A client's first INFERMETER_AUTH_FAILURES_ALLOWED failures cost nothing. Each further failure makes it
wait before it may present credentials again: 1 s after the first, then 2, 4, 8 ... s, at most
INFERMETER_AUTH_BACKOFF_MAX_S (0 turns the backoff off). While it waits, every request of that client
that presents credentials, a right one included, is answered 429 with `Retry-After` before anything
is checked; its other requests (the sign-in page, static files, a signed-in session) pass. A client
without a failure for twice the longest wait starts again from nothing.

The backoff is keyed by the client, never by the key or the customer: failures from one address never
slow down a customer signing in from another. It is kept per process (in memory, not shared between
the processes serving the API): an attacker that spreads its tries over N processes gets N times the
allowance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from dashboards.web.responses import error_json, plain_page
from infermeter.auth_backoff import FailedAuthentications

SIGN_IN_FORMS = ("/signin", "/admin/signin")


class AuthBackoff:
    """ASGI middleware: the backoff above, for the app it wraps. Add it outermost, after the others
    (`app.add_middleware(AuthBackoff, settings=settings)`), so that it sees every answer, the data
    fast path's included. `clock` is the failures' clock (seconds)."""

    def __init__(self, app, *, settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.failures = FailedAuthentications.of(settings, clock=clock)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.failures.active or not _presents_credentials(scope):
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown",))[0]
        wait = self.failures.wait_s(client)
        if wait > 0:
            await _too_many(scope, math.ceil(wait), self.failures)(scope, receive, send)
            return

        async def watch(message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.failures.failed(client)
            await send(message)

        await self.app(scope, receive, watch)


def _presents_credentials(scope) -> bool:
    for name, _ in scope["headers"]:
        if name == b"authorization":
            return True
    return scope["method"] == "POST" and scope["path"] in SIGN_IN_FORMS


def _too_many(scope, retry_after: int, failures: FailedAuthentications):
    message = failures.message(retry_after)
    headers = {"Retry-After": str(retry_after)}
    if scope["method"] == "POST" and scope["path"] in SIGN_IN_FORMS:
        return plain_page("message.html", 429, headers, title="Too many failed sign-ins", message=message)
    response = error_json(429, message, "too_many_failed_authentications")
    response.headers.update(headers)
    return response
