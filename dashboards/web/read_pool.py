"""The async read pool of the customer chart data endpoints: they read in the event loop from it
(autocommit connections in UTC), opened and closed by the app's lifespan."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from dashboards.web.state import database_url

READ_POOL_MAX = 4


async def open_read_pool(app: FastAPI) -> None:
    """Open the pool the customer dashboard's chart data endpoints read from in the event loop
    (autocommit connections in UTC). Call it in the app's lifespan, with `close_read_pool` after: an
    app whose lifespan did not run (or a request from another event loop) reads in a worker thread
    from `state.pool`, as the pages do."""
    from psycopg_pool import AsyncConnectionPool

    from infermeter.stack.postgres import to_libpq_url

    async def utc(conn) -> None:
        await conn.execute("SET TIME ZONE 'UTC'")

    pool = AsyncConnectionPool(to_libpq_url(database_url(app.state)), min_size=1, max_size=READ_POOL_MAX, open=False,
                               kwargs={"autocommit": True}, configure=utc)
    await pool.open()
    app.state.dashboards_read_pool = (asyncio.get_running_loop(), pool)


async def close_read_pool(app: FastAPI) -> None:
    held = getattr(app.state, "dashboards_read_pool", None)
    app.state.dashboards_read_pool = None
    if held is not None:
        await held[1].close()


def read_pool(request: Request):
    """The async read pool, when it was opened in this request's event loop; else None."""
    held = getattr(request.app.state, "dashboards_read_pool", None)
    return held[1] if held is not None and held[0] is asyncio.get_running_loop() else None
