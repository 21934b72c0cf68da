"""How the data endpoints are declared in the API's OpenAPI document.

The JSON and CSV data endpoints are API (bearer credentials work): they are declared, and fuzzed by
tests/test_openapi_fuzz.py. Pages, forms (sign-in, CSRF) and static files stay out of the document.
"""

from __future__ import annotations

from typing import Any

from fastapi import Path as PathParam

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "code"],
    "properties": {"message": {"type": "string"}, "code": {"type": "string"}}}}}
# RFC 3339; empty (what a page's cleared date input sends) means the default
_TIME_OR_EMPTY = {"type": "string", "anyOf": [{"format": "date-time"}, {"maxLength": 0}]}
WINDOW_QUERY = [
    {"name": "from", "in": "query", "required": False, "schema": _TIME_OR_EMPTY,
     "description": "window start, RFC 3339 (floored to the hour); default: `to` minus the page's default span"},
    {"name": "to", "in": "query", "required": False, "schema": _TIME_OR_EMPTY,
     "description": "window end, RFC 3339 (rounded up to the hour); default: the end of the current hour"},
]


def data_route(names: list[str], query: list[dict], *, admin: bool) -> dict[str, Any]:
    """The decorator arguments that declare a data endpoint: its query parameters and its answers
    (JSON or CSV; errors in the API's {"error": {message, code}} shape)."""
    who = "Admin credentials (session or bearer token)" if admin else \
        "A customer (session or bearer API key: only itself) or an admin (with customer_id)"
    errors = {400: "bad filters", 401: "not signed in", 403: "not for these credentials", 404: "no such chart "
              "(or another customer's data: existence is not disclosed)"}
    return {
        "description": f"{who}. `name` is a chart and a format: {', '.join(names)}.",
        "openapi_extra": {"parameters": query},
        "responses": {
            200: {"description": "the chart's data", "content": {
                "application/json": {"schema": {"type": "object"}}, "text/csv": {"schema": {"type": "string"}}}},
            **{status: {"description": text, "content": {"application/json": {"schema": _ERROR}}}
               for status, text in errors.items()},
        },
    }


def chart_names(charts: tuple[str, ...], *, no_csv: tuple[str, ...] = ()) -> list[str]:
    return [f"{c}.{fmt}" for c in charts for fmt in ("json", "csv") if not (fmt == "csv" and c in no_csv)]


def name_param(names: list[str]):
    return PathParam(description="chart.format", json_schema_extra={"enum": names})
