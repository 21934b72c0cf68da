"""A customer's data residency over HTTP and the CLI (mounted by app/api.py and app/cli/__init__.py).

    GET /v1/customers/{customer_id}/residency    -> {"customer_id", "regions": [...] | null, "known_regions"}
    PUT /v1/customers/{customer_id}/residency    {"regions": ["eu-west", ...]} restricts, {"regions": null} lifts
    infermeter customers residency C [--regions eu-west,eu-central | --clear] [--json]

Admin credentials only (401 without valid credentials, 403 for producer and customer keys). Regions
must be among INFERMETER_REGIONS: an unknown one is a 400 (`unknown_region`) / a one-line CLI error
(exit 2) and nothing is written. Gateways apply a change within INFERMETER_KEY_CACHE_TTL_S
(serving/residency.py).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from fastapi import APIRouter, Request

from infermeter.http import PrincipalDep, error, error_responses
from serving.residency import ResidencyError, clear_residency, get_residency, set_residency
from serving.upstreams import REGION_RE, parse_regions

router = APIRouter(tags=["residency"], responses=error_responses(400, 401, 403))


def _known(settings) -> tuple[str, ...]:
    return parse_regions(settings.regions, what="INFERMETER_REGIONS")


def _view(customer_id: str, regions: tuple[str, ...] | None, known: tuple[str, ...]) -> dict[str, Any]:
    return {"customer_id": customer_id, "regions": None if regions is None else list(regions),
            "known_regions": list(known)}


def _engine(request: Request):
    from infermeter.db import get_engine

    return get_engine(request.app.state.database_url)


@router.get("/v1/customers/{customer_id}/residency")
def get_customer_residency(request: Request, principal: PrincipalDep, customer_id: str) -> dict[str, Any]:
    if not principal.is_admin:
        raise error(403, "data residency is for admins", "forbidden")
    return _view(customer_id, get_residency(_engine(request), customer_id), _known(request.app.state.settings))


RESIDENCY_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "object", "required": ["regions"], "properties": {"regions": {
        "anyOf": [{"type": "array", "minItems": 1, "items": {"type": "string", "pattern": REGION_RE.pattern}},
                  {"type": "null"}],
        "description": "region names, each one of INFERMETER_REGIONS (`known_regions`); null lifts the restriction"}}},
    "example": {"regions": ["eu-west"]}}}}}


@router.put("/v1/customers/{customer_id}/residency", openapi_extra=RESIDENCY_BODY)
async def put_customer_residency(request: Request, principal: PrincipalDep, customer_id: str) -> dict[str, Any]:
    if not principal.is_admin:
        raise error(403, "data residency is for admins", "forbidden")
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise error(400, "the body must be JSON: {\"regions\": [\"eu-west\", ...]} or {\"regions\": null}",
                    "invalid_request") from None
    if not isinstance(body, dict) or "regions" not in body or not (
        body["regions"] is None or (isinstance(body["regions"], list) and all(isinstance(r, str) for r in body["regions"]))
    ):
        raise error(400, "the body must be {\"regions\": [\"eu-west\", ...]} (a list of region names) or "
                    "{\"regions\": null} to lift the restriction", "invalid_request")
    known = _known(request.app.state.settings)
    engine = _engine(request)
    if body["regions"] is None:
        clear_residency(engine, customer_id)
        return _view(customer_id, None, known)
    try:
        regions = set_residency(engine, customer_id, body["regions"], known=known)
    except ResidencyError as exc:
        raise error(400, str(exc), "unknown_region") from None
    return _view(customer_id, regions, known)


def residency_command(
    customer: Annotated[str, typer.Argument(help="Customer id.")],
    regions: Annotated[str | None, typer.Option("--regions", help="Restrict to these regions (comma-separated, "
                                                "each one of INFERMETER_REGIONS).")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Lift the restriction.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show, set (--regions) or lift (--clear) the regions a customer's requests may be served in."""
    from rich.console import Console
    from sqlalchemy.exc import SQLAlchemyError

    from infermeter.db import get_engine
    from infermeter.settings import get_settings
    from infermeter.stack import StackError
    from infermeter.stack.local import open_stack

    err = Console(stderr=True)

    def fail(message: str) -> None:
        err.print(f"[red]error:[/red] {message}", soft_wrap=True, highlight=False)
        raise typer.Exit(2)

    if regions is not None and clear:
        fail("give --regions or --clear, not both")
    settings = get_settings()
    try:
        known = _known(settings)
        if regions is not None:  # checked before anything starts or is written
            from serving.residency import checked_regions

            checked_regions(regions, known)
    except ValueError as exc:
        fail(str(exc))
    try:
        with open_stack(settings, broker=False) as stack:
            engine = get_engine(stack.database_url)
            if regions is not None:
                found = set_residency(engine, customer, regions, known=known)
            elif clear:
                found = None
                if not clear_residency(engine, customer):
                    err.print(f"customer {customer} had no residency restriction")
            else:
                found = get_residency(engine, customer)
    except ResidencyError as exc:
        fail(str(exc))
    except StackError as exc:
        fail(str(exc))
    except SQLAlchemyError as exc:
        fail(f"database error: {str(exc).splitlines()[0]}")
    if as_json:
        sys.stdout.write(json.dumps(_view(customer, found, known)) + "\n")
        return
    if found is None:
        print(f"{customer}: not restricted (served in any region)")
    else:
        print(f"{customer}: served only in {', '.join(found)}")


__all__ = ["residency_command", "router"]
