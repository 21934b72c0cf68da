"""GET /v1/pricing/shadow: the running current-period revenue under every candidate book (live).

Mount with `app.include_router(pricing_service.api.router)`. Reads `request.app.state.settings`
(INFERMETER_PRICING_BOOKS, INFERMETER_PRICING_COST_MODEL) and `request.app.state.pool` (the psycopg
ConnectionPool the app puts there, app.api.create_app).
Admin: every customer, or `?customer_id=`; a customer API key: only itself (asking for another
customer answers 404). The period ends at `infermeter.http.now` (the current time; a dependency the tests override).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from infermeter.http import Now, PrincipalDep, error, error_responses, scope
from pricing.book import PriceBookError
from pricing.cost import CostModelError
from pricing_service.books import book_paths, read_cost_model, read_price_book
from pricing_service.shadow import shadow_rating_on

router = APIRouter(tags=["pricing"], responses=error_responses(400, 401, 403, 404))


def candidate_books(settings) -> list:
    return [read_price_book(p) for p in book_paths(settings.pricing_books)]


@router.get("/v1/pricing/shadow")
async def get_shadow(
    request: Request,
    principal: PrincipalDep,
    as_of: Now,
    customer_id: str | None = Query(default=None, description="admin only; customers see themselves"),
) -> dict[str, Any]:
    customer = scope(principal, customer_id)
    settings = request.app.state.settings
    try:
        books = candidate_books(settings)
        cost_model = read_cost_model(settings.pricing_cost_model)
    except (PriceBookError, CostModelError) as exc:
        raise error(500, f"pricing configuration is invalid: {exc}", "pricing_config") from None

    def run() -> dict[str, Any]:
        with request.app.state.pool.connection() as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            return shadow_rating_on(conn, books, cost_model, now=as_of, customer_id=customer).to_json()

    return await run_in_threadpool(run)
