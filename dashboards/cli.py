"""`infermeter serve dashboards`: the dashboard pages alone (no /v1 API) on their own port.

`infermeter up` and `infermeter api` serve the same pages on the API port; this command is for
running the pages as a separate process. It needs the serving key store to sign customers in and
billing's views for the pages' billing sections, and the predictors' and the alerts' views for theirs,
which dashboards may not import (layers): the roof (app/cli/__init__.py) passes a factory of each to `serve_command`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from dashboards.billing_views import BillingViews
    from dashboards.prediction_views import PredictionViews


def serve_command(key_store: Callable[[object, str], object],
                  billing: Callable[[object, str], BillingViews | None],
                  predictions: Callable[[object, str], PredictionViews | None] | None = None) -> Callable[..., None]:
    """The `serve dashboards` command; `key_store(settings, database_url)` builds the key store,
    `billing(settings, database_url)` billing's views (dashboards.billing_views) and
    `predictions(settings, database_url)` the predictors' and the alerts' (dashboards.prediction_views)."""

    def serve_dashboards(
        host: Annotated[str | None, typer.Option(help="Bind address (INFERMETER_API_HOST).")] = None,
        port: Annotated[int | None, typer.Option(help="Port (INFERMETER_DASHBOARD_PORT).")] = None,
    ) -> None:
        """Serve the dashboards: /dashboard (customers), /admin/ops, /admin/pricing, /admin/finance."""
        from dashboards.web.app import create_dashboard_app
        from infermeter.settings import get_settings
        from infermeter.stack.local import open_stack
        from infermeter.stack.signals import serve_http, stop_on_signals

        settings = get_settings()
        bind = host or settings.api_host
        settings.check_listen_address(bind)  # no development credentials off loopback
        typer.echo(f"dashboards: http://{bind}:{port or settings.dashboard_port}/dashboard "
                   f"(admin token {settings.credentials_note()})", err=True)
        with stop_on_signals(), contextlib.suppress(KeyboardInterrupt), open_stack(settings, broker=False) as stack:
            run_settings = stack.settings_for(settings)
            app = create_dashboard_app(run_settings, stack.database_url, key_store(run_settings, stack.database_url),
                                       billing=billing(run_settings, stack.database_url),
                                       predictions=predictions(run_settings, stack.database_url) if predictions else None)
            serve_http(app, host=bind, port=port or settings.dashboard_port, log_level="info")

    return serve_dashboards
