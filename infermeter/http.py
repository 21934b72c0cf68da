"""HTTP plumbing every API router shares: errors in one shape, the caller's principal, tenant scope.

Routers (metering.api, pricing_service.api, ...) depend on `PrincipalDep` (`AdminDep` for admin-only
operations) and are built with `route_class=CredentialsFirst`, so that the credentials (and the admin
token's rights) are checked before the parameters and the body: a customer key gets 403 on an admin
operation whatever it sends. The app that mounts them (app.api) puts a key store with
`async authenticate(token) -> Principal` on `app.state.keys` and installs `error_handler` and
`validation_error_handler`, so every error, 422 included, answers `{"error": {"message", "code"}}`.
Routers declare those answers in the OpenAPI document with `error_responses(...)` (the shape is
`ErrorResponse`); `declare_error_shape` makes the 422 FastAPI declares on its own say the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
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
    422: "A parameter or the body does not have the declared form (the message says which)",
    503: "A dependency (event bus, configuration) is not available; retry later",
}


# What a parameter's schema declares that the service checks itself (answering 400 with its own
# message): `json_schema_extra` of a Query or a Field.
DATE_TIME: dict[str, Any] = {"format": "date-time"}  # RFC 3339 with a zone (infermeter.times.parse_time)
DATE: dict[str, Any] = {"format": "date"}  # YYYY-MM-DD
# a billing period YYYY-MM, 1970-01 to 9998-12 (billing.periods)
PERIOD: dict[str, Any] = {"pattern": "^(19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])$"}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error answers an operation gives, each an `ErrorResponse`."""
    return {status: {"model": ErrorResponse, "description": ERROR_MEANINGS[status]} for status in statuses}


# Declares bearer authentication in the OpenAPI document; `get_principal` reads the header itself so
# that a missing or malformed one answers 401 in the error shape above.
_bearer_scheme = HTTPBearer(auto_error=False, description="the admin token, the producer token or a customer API key")


def error(status: int, message: str, code: str) -> HTTPException:
    return HTTPException(status_code=status, detail={"message": message, "code": code})


async def error_handler(request: Request, exc: HTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail), "code": "error"}
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), **_allowed_methods(request)}
    return JSONResponse({"error": detail}, status_code=exc.status_code, headers=headers)


def _allowed_methods(request: Request) -> dict[str, str]:
    """`Allow` for a 405: every method the OpenAPI document declares for the path (Starlette names
    only those of the first route that matches it, e.g. GET where GET and POST are served)."""
    app = request.app
    if not isinstance(app, FastAPI) or app.openapi_url is None:
        return {}
    path = request.url.path
    methods: set[str] = set()
    for template, operations in app.openapi().get("paths", {}).items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            methods.update(method.upper() for method in operations)
    if "GET" in methods:
        methods.add("HEAD")
    return {"Allow": ", ".join(sorted(methods))} if methods else {}


def _validation_message(exc: RequestValidationError) -> str:
    """`query.period: Field required; body.amount: Input should be a valid string`: each error where it is."""
    parts = []
    for problem in exc.errors():
        where = ".".join(str(part) for part in problem.get("loc", ()))
        parts.append(f"{where}: {problem.get('msg', 'invalid')}" if where else str(problem.get("msg", "invalid")))
    return "; ".join(parts) or "the request is not valid"


async def validation_error_handler(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """A parameter or body the declared checks refuse: 422 in the error shape (not FastAPI's `{"detail": [...]}`)."""
    return JSONResponse({"error": {"message": _validation_message(exc), "code": "invalid_request"}}, status_code=422)


def declare_error_shape(app: FastAPI) -> None:
    """Make `app`'s OpenAPI document declare every 422 as an `ErrorResponse` (what
    `validation_error_handler` answers) instead of FastAPI's own `HTTPValidationError`."""

    framework_document = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = framework_document()  # FastAPI's, kept as app.openapi_schema: amended in place
            error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
            for operations in document.get("paths", {}).values():
                for operation in operations.values():
                    answer = operation.get("responses", {}).get("422")
                    if answer is not None:
                        answer["description"] = ERROR_MEANINGS[422]
                        answer["content"] = {"application/json": {"schema": error_ref}}
            schemas = document.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def data_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    """A value the database cannot take (SQLSTATE class 22: a NUL character in text, a number out of
    range, ...) came from the request: 400 with the reason; the transaction was rolled back."""
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
    return JSONResponse({"error": {"message": f"the request holds a value that cannot be stored or searched: {reason}",
                                   "code": "invalid_input"}}, status_code=400)


async def get_principal(request: Request, _declared: Annotated[Any, Depends(_bearer_scheme)] = None) -> Principal:
    """The caller, from its bearer token (admin, producer, or a customer API key); once per request
    (`CredentialsFirst` has already asked the key store on the routes it serves)."""
    known = request.scope.get(_PRINCIPAL)
    if known is not None:
        return known
    try:
        token = bearer_token(request.headers.get("authorization"))
        return await request.app.state.keys.authenticate(token)
    except AuthError as exc:
        raise error(401, str(exc) or "invalid credentials", "invalid_api_key") from None


PrincipalDep = Annotated[Principal, Depends(get_principal)]
_PRINCIPAL = "infermeter.principal"  # where CredentialsFirst leaves the caller in the request's scope


async def get_admin(principal: PrincipalDep) -> Principal:
    """The caller, who must hold the admin token (403 for producer and customer keys)."""
    if not principal.is_admin:
        raise error(403, "this operation needs the admin token", "forbidden")
    return principal


AdminDep = Annotated[Principal, Depends(get_admin)]


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any] | None]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


class CredentialsFirst(APIRoute):
    """A route that checks its caller before FastAPI reads the parameters and the body: a route that
    depends on `get_principal` answers 401 without valid credentials, and one that depends on
    `get_admin` answers 403 to any other credentials, whatever the request holds (FastAPI would first
    answer 422 to a malformed body, telling a customer key what an admin operation expects)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        calls = set(_calls(self.dependant))
        if get_principal not in calls:
            return handler
        admin_only = get_admin in calls

        async def checked(request: Request) -> Response:
            principal = await get_principal(request)
            if admin_only:
                await get_admin(principal)
            request.scope[_PRINCIPAL] = principal
            return await handler(request)

        return checked


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
