"""What the pages read from `app.state` besides `settings`, `pool` (a psycopg ConnectionPool) and
`keys` (the key store: `async authenticate(token) -> Principal`, `async session_principal(key_id) ->
Principal | None`): billing's views (`billing`: dashboards.billing_views.BillingViews, or None when
billing is not wired), the predictors' and the alerts' (`predictions`:
dashboards.prediction_views.PredictionViews, or None or unset when not wired), the clocks (`clock`: now; `billing_clock`: None, or the instant the customer's
billing figures are shown as of) and the database's URL. The app factory sets them from its arguments
(app.api.create_app, dashboards.web.app.create_dashboard_app)."""

from __future__ import annotations

from datetime import datetime

from fastapi import Request

from dashboards.billing_views import BillingViews
from dashboards.prediction_views import PredictionViews


def now(request: Request) -> datetime:
    """Now, by the app's clock."""
    return request.app.state.clock()


def billing_now(request: Request) -> datetime:
    """The instant the customer's billing figures (the current period's preview, the prepaid credit
    balance) are shown as of: the app's billing clock when it has one (the demo: the instant its
    billing run is made as of, so the page agrees with the demo's invoices), else now."""
    state = request.app.state
    return (state.billing_clock or state.clock)()


def billing_views(request: Request) -> BillingViews | None:
    """Billing's parts of the pages, or None: billing is not wired (the pages show none of it)."""
    return request.app.state.billing


def database_url(state) -> str:
    """The database the app reads (`app.state.database_url`, else the settings')."""
    return getattr(state, "database_url", None) or state.settings.database_url


def prediction_views(request: Request) -> PredictionViews | None:
    """The predictors' and the alerts' parts of the pages, or None: not wired (the pages show none of it)."""
    return getattr(request.app.state, "predictions", None)
