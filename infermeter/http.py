"""HTTP plumbing every API router shares: errors in one shape, the caller's principal, tenant scope.

Routers (metering.api, pricing_service.api, ...) depend on `PrincipalDep`; the app that mounts them
(app.api) puts a key store with `async authenticate(token) -> Principal` on `app.state.keys` and
installs `error_handler`, so every error answers `{"error": {"message", "code"}}`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse

from infermeter.auth import AuthError, Forbidden, Principal, bearer_token


def error(status: int, message: str, code: str) -> HTTPException:
    return HTTPException(status_code=status, detail={"message": message, "code": code})


async def error_handler(_request: Request, exc: HTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail), "code": "error"}
    return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)


async def get_principal(request: Request) -> Principal:
    """The caller, from its bearer token (admin, producer, or a customer API key)."""
    try:
        token = bearer_token(request.headers.get("authorization"))
        return await request.app.state.keys.authenticate(token)
    except AuthError as exc:
        raise error(401, str(exc) or "invalid credentials", "invalid_api_key") from None


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def scope(principal: Principal, customer_id: str | None) -> str | None:
    """The customer a read is limited to: 404 for another customer's data, 403 for producers."""
    try:
        return principal.customer_scope(customer_id)
    except LookupError:
        raise error(404, "not found", "not_found") from None
    except Forbidden as exc:
        raise error(403, str(exc), "forbidden") from None
