"""The capacity signal over HTTP and the CLI (mounted by app/api.py and app/cli/__init__.py).

    GET /v1/deployments/{deployment_id}/capacity[?at=RFC3339][&history=true]   (admin credentials)
    infermeter capacity [--deployment D] [--at T] [--history] [--json]

The report (serving.capacity.report) as of the end of the last complete minute before `at`
(default: now): demand, its Holt forecast, tokens per busy replica-second, utilisation and the
recommended replica count, from metering and the gateways' demand at arrival. 401 without valid
credentials, 403 for anything but the admin token, 404 for a deployment with nothing metered or
admitted in the last hour.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from fastapi import APIRouter, Query, Request

from infermeter.http import DATE_TIME, AdminDep, CredentialsFirst, error, error_responses
from infermeter.times import TimeInputError, parse_time
from serving.capacity_service import HISTORY_MIN, capacity_reports, policy_from_settings

router = APIRouter(tags=["capacity"], responses=error_responses(400, 401, 403, 404), route_class=CredentialsFirst)


@router.get("/v1/deployments/{deployment_id}/capacity")
def get_capacity(request: Request, _admin: AdminDep, deployment_id: str,
                 at: Annotated[str | None, Query(description="RFC 3339; default now", json_schema_extra=DATE_TIME)] = None,
                 history: bool = False) -> dict[str, Any]:
    try:
        now = parse_time(at, "at") if at else datetime.now(UTC)
    except TimeInputError as exc:
        raise error(400, str(exc), "invalid_query") from None
    policy = policy_from_settings(request.app.state.settings)
    with request.app.state.pool.connection() as conn:
        found = capacity_reports(conn, now=now, policy=policy, deployment_id=deployment_id, history=history)
    if not found:
        raise error(404, f"nothing metered for deployment {deployment_id} in the last {HISTORY_MIN} minutes",
                    "not_found")
    return found[0]


def capacity_command(
    deployment: Annotated[str | None, typer.Option("--deployment", help="One deployment only.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="As of this time (RFC 3339); default now.")] = None,
    history: Annotated[bool, typer.Option("--history", help="Include the per-minute history (JSON).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print {\"deployments\": [report, ...]}.")] = False,
) -> None:
    """Per deployment: metered demand, its forecast, replica capacity and the recommended replicas."""
    import psycopg
    from rich.console import Console
    from rich.table import Table

    from infermeter.settings import get_settings
    from infermeter.stack.local import open_stack
    from infermeter.stack.postgres import to_libpq_url

    now = parse_time(at, "--at") if at else datetime.now(UTC)
    settings = get_settings()
    with open_stack(settings, broker=False) as stack, psycopg.connect(to_libpq_url(stack.database_url)) as conn:
        reports = capacity_reports(conn, now=now, policy=policy_from_settings(settings), deployment_id=deployment,
                                   history=history)
    if as_json:
        sys.stdout.write(json.dumps({"deployments": reports}, indent=2) + "\n")
        return
    console = Console()
    if not reports:
        console.print(f"nothing metered in the last {HISTORY_MIN} minutes")
        return
    table = Table("deployment", "tokens/s", "forecast", "per replica", "replicas", "utilisation", "needed",
                  "recommended", title=f"capacity as of {reports[0]['as_of']} (target {settings.target_utilisation:g})")
    for r in reports:
        util = r["utilisation"]["measured"]
        table.add_row(r["deployment_id"], f"{r['demand']['tokens_per_s']:,.1f}",
                      f"{r['forecast'].get('tokens_per_s', 0.0):,.1f}",
                      "-" if r["capacity"]["tokens_per_busy_s"] is None else f"{r['capacity']['tokens_per_busy_s']:,.1f}",
                      str(r["replicas"]), "-" if util is None else f"{util:.0%}",
                      str(r["needed_replicas"] if r["needed_replicas"] is not None else "-"),
                      str(r["recommended_replicas"] if r["recommended_replicas"] is not None else "-"))
    console.print(table)
