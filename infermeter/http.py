"""HTTP plumbing every API router shares: errors in one shape, the caller's principal, tenant scope.

Routers (metering.api, pricing_service.api, ...) depend on `PrincipalDep`; the app that mounts them
(app.api) puts a key store with `async authenticate(token) -> Principal` on `app.state.keys` and
installs `error_handler`, so every error answers `{"error": {"message", "code"}}`. Routers declare
those answers in the OpenAPI document with `error_responses(...)` (the shape is `ErrorResponse`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel

from infermeter.auth import AuthError, Forbidden, Principal, bearer_token
from infermeter.times import utc_now


class ErrorDetail(BaseModel):
    message: str
    code: str


class ErrorResponse(BaseModel):
    """What every error answers (`error_handler`)."""

    error: ErrorDetail


ERROR_MEANINGS = {
    400: "Bad input (the message says what); nothing was written",
    401: "Missing or invalid credentials",
    403: "These credentials may not do this",
    404: "Not found (also another customer's object: existence is not disclosed)",
    409: "Conflicts with what is stored",
    413: "Too large",
    415: "Unsupported content type",
    503: "A dependency (event bus, configuration) is not available; retry later",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error answers an operation gives, each an `ErrorResponse`."""
    return {status: {"model": ErrorResponse, "description": ERROR_MEANINGS[status]} for status in statuses}


# Declares bearer authentication in the OpenAPI document; `get_principal` reads the header itself so
# that a missing or malformed one answers 401 in the error shape above.
_bearer_scheme = HTTPBearer(auto_error=False, description="the admin token, the producer token or a customer API key")


def error(status: int, message: str, code: str) -> HTTPException:
    return HTTPException(status_code=status, detail={"message": message, "code": code})


async def error_handler(_request: Request, exc: HTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail), "code": "error"}
    return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)


async def data_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    """A value the database cannot take (SQLSTATE class 22: a NUL character in text, a number out of
    range, ...) came from the request: 400 with the reason; the transaction was rolled back."""
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
    return JSONResponse({"error": {"message": f"the request holds a value that cannot be stored or searched: {reason}",
                                   "code": "invalid_input"}}, status_code=400)


async def get_principal(request: Request, _declared: Annotated[Any, Depends(_bearer_scheme)] = None) -> Principal:
    """The caller, from its bearer token (admin, producer, or a customer API key)."""
    try:
        token = bearer_token(request.headers.get("authorization"))
        return await request.app.state.keys.authenticate(token)
    except AuthError as exc:
        raise error(401, str(exc) or "invalid credentials", "invalid_api_key") from None


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def now(request: Request) -> datetime:
    """The instant a request acts at, every router's one clock: the app's `clock` (`app.state.clock`,
    what `create_app(clock=...)` is given; the demo and the tests give one), else the current time."""
    clock = getattr(request.app.state, "clock", None)
    return clock() if clock is not None else utc_now()


Now = Annotated[datetime, Depends(now)]


def scope(principal: Principal, customer_id: str | None) -> str | None:
    """The customer a read is limited to: 404 for another customer's data, 403 for producers."""
    try:
        return principal.customer_scope(customer_id)
    except LookupError:
        raise error(404, "not found", "not_found") from None
    except Forbidden as exc:
        raise error(403, str(exc), "forbidden") from None
