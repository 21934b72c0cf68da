"""The chart data endpoints' fast path.

GET /dashboard/data/{chart}.json with a customer's bearer API key is what a dashboard polls and what
bench.dashboards times against the bare SQL: answered by an ASGI middleware before FastAPI's routing
(matching the path against every route of the API app, the endpoint's parameter handling) with the
same functions the route calls. Anything else, and any request it cannot answer as the route would
(no bearer key, an admin or producer token, a bad key, another customer's id, bad times, a database
error, no read pool in this event loop), goes on to the route unchanged: only reads have happened.
"""

from __future__ import annotations

import urllib.parse

import orjson
from fastapi import Request

from dashboards.web.auth import Viewer
from dashboards.web.customer_data import CUSTOMER_CHARTS, chart_of, data_view, summary
from dashboards.web.read_pool import read_pool
from infermeter.auth import AuthError, bearer_token

_FAST_PATHS = {f"/dashboard/data/{chart}.json": chart for chart in CUSTOMER_CHARTS}


class DataFastPath:
    """ASGI middleware: the customer chart data endpoints' fast path (above). Add it to an app that
    mounts the dashboards' router (app.add_middleware(DataFastPath))."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            chart = _FAST_PATHS.get(scope["path"])
            if chart is not None:
                body = await _fast_data(scope, receive, chart)
                if body is not None:
                    # the headers `json_response`'s Response sends, in its order
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"cache-control", b"no-store"), (b"content-length", str(len(body)).encode("latin-1")),
                        (b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


async def _fast_data(scope, receive, chart: str) -> bytes | None:
    """`dashboard_data`'s JSON body for a customer's bearer key, or None: the route answers. Reads the
    headers and the query as Starlette's Request does (the first Authorization header; the last value
    of a repeated query parameter)."""
    authorization = next((value for name, value in scope["headers"] if name == b"authorization"), None)
    request = Request(scope, receive)
    pool = read_pool(request)
    if not authorization or pool is None:
        return None
    try:
        principal = await request.app.state.keys.authenticate(bearer_token(authorization.decode("latin-1")))
    except AuthError:
        return None
    params = dict(urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    if principal.kind != "customer" or params.get("customer_id") not in (None, principal.customer_id):
        return None
    try:
        view = await data_view(request, pool, Viewer(principal, None), params, chart)
    except Exception:  # noqa: BLE001 - bad times, a database error: the route answers it (only reads ran)
        return None
    return orjson.dumps(summary(view) if chart == "summary" else chart_of(view, chart).to_json())
