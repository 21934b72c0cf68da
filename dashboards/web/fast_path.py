"""The chart data endpoints' fast path: GET /dashboard/data/{chart}.json with a customer's bearer API
key (what a dashboard polls) answered by an ASGI middleware before FastAPI's routing (matching the
path against every route of the app, the endpoint's parameter handling).

It calls the route's own handler (customer_data.chart_data) and only adapts: the ASGI scope in, the
JSON body out with the headers the route's response has. Whatever it does not answer goes on to the
route untouched, having only read: a request without a bearer key (a session), no read pool in this
event loop, an admin or producer token, and anything the handler refuses (a bad key, another
customer's id, bad times) or fails on (a database error).
"""

from __future__ import annotations

import orjson
from fastapi import Request

from dashboards.web.customer_data import CUSTOMER_CHARTS, chart_data
from dashboards.web.read_pool import read_pool

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
                body = await _answer(Request(scope, receive), chart)
                if body is not None:
                    # the headers `responses.json_response` sends, in its order
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"cache-control", b"no-store"), (b"content-length", str(len(body)).encode("latin-1")),
                        (b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


async def _answer(request: Request, chart: str) -> bytes | None:
    """The route's JSON body for a customer's bearer key, or None: the route answers."""
    if not request.headers.get("authorization") or read_pool(request) is None:
        return None
    try:
        data = await chart_data(request, chart, customers_only=True)
    except Exception:  # noqa: BLE001 - refused, or a database error: the route answers it (only reads ran)
        return None
    return orjson.dumps(data.payload())
