"""The alerts' records in PostgreSQL (`alerts.tables`): endpoints, per-customer thresholds, alerts and
their deliveries. Every function takes an open psycopg connection in autocommit mode (as the commands
and the schedule open them): each one that writes runs its own transaction, committed when it returns.

- `set_endpoint`, `endpoints`, `remove_endpoint`: where alerts go, each endpoint with its own secret.
- `set_thresholds`, `clear_thresholds`, `thresholds_for`: a customer's thresholds over the defaults.
- `record(conn, crossing, now=...)`: the alert, once per (customer, kind, threshold, period), and a
  pending delivery to each endpoint that takes the customer's alerts; None if it had fired already.
- `alerts_for(conn, customer_id)`, `list_alerts(conn, customer_id=None)`: what fired and how each
  delivery went, newest first (the dashboards' read, docs/alerts.md).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

import psycopg
from psycopg.types.json import Jsonb

from alerts.rules import Crossing, ThresholdError, Thresholds, parse_percents, percents_text
from alerts.signing import new_secret
from infermeter.times import utc_text

ANY_CUSTOMER = ""  # an endpoint for every customer's alerts


class AlertError(ValueError):
    """Bad input to the alerts' commands: one line saying what is wrong."""


def _id(prefix: str, *parts: str) -> str:
    return prefix + hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def alert_id(customer_id: str, kind: str, threshold: str, period: str) -> str:
    """The alert's id: a hash of its key, so that the same alert has the same id wherever it is computed."""
    return _id("alrt_", customer_id, kind, threshold, period)


def delivery_id(alert: str, endpoint_id: str) -> str:
    """The delivery's id, the same on every attempt (`Infermeter-Delivery` and the body's "id")."""
    return _id("dlv_", alert, endpoint_id)


# ---------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: str
    url: str
    secret: str
    customer_id: str  # '' = every customer

    def to_json(self, *, show_secret: bool = False) -> dict:
        return {"endpoint_id": self.endpoint_id, "url": self.url, "customer_id": self.customer_id or None,
                "secret": self.secret if show_secret else self.secret[:10] + "..."}


def check_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertError(f"--url {url!r} is not an http(s) URL such as https://example.com/hooks/infermeter")
    return url.strip()


def set_endpoint(conn: psycopg.Connection, url: str, *, secret: str | None = None, customer_id: str = ANY_CUSTOMER,
                 now: datetime) -> tuple[Endpoint, bool]:
    """Add an endpoint for `customer_id`'s alerts ('' = everyone's), or give an existing one (same url and
    customer) a new secret when `secret` is given. Returns it and whether it is new. A secret is made
    when none is given (`alerts.signing.new_secret`)."""
    url = check_url(url)
    if secret is not None and len(secret.strip()) < 16:
        raise AlertError("--secret must be at least 16 characters (leave it out to have one made)")
    with conn.transaction():
        row = conn.execute("SELECT endpoint_id, secret FROM alert_endpoints WHERE url = %s AND customer_id = %s "
                           "FOR UPDATE", (url, customer_id)).fetchone()
        if row is not None:
            if secret is not None:
                conn.execute("UPDATE alert_endpoints SET secret = %s, updated_at = %s WHERE endpoint_id = %s",
                             (secret.strip(), now, row[0]))
            return Endpoint(row[0], url, secret.strip() if secret is not None else row[1], customer_id), False
        endpoint = Endpoint("we_" + secrets.token_hex(8), url, (secret or new_secret()).strip(), customer_id)
        conn.execute("INSERT INTO alert_endpoints (endpoint_id, url, secret, customer_id, created_at, updated_at) "
                     "VALUES (%s, %s, %s, %s, %s, %s)",
                     (endpoint.endpoint_id, endpoint.url, endpoint.secret, endpoint.customer_id, now, now))
    return endpoint, True


def endpoints(conn: psycopg.Connection, customer_id: str | None = None) -> list[Endpoint]:
    """Every endpoint, or those that receive `customer_id`'s alerts (its own and everyone's)."""
    rows = conn.execute(
        "SELECT endpoint_id, url, secret, customer_id FROM alert_endpoints "
        "WHERE %(c)s::text IS NULL OR customer_id IN (%(c)s, '') ORDER BY created_at, endpoint_id",
        {"c": customer_id}).fetchall()
    return [Endpoint(*r) for r in rows]


def remove_endpoint(conn: psycopg.Connection, endpoint: str) -> bool:
    """Remove an endpoint (by id or url); its deliveries not yet made are cancelled."""
    with conn.transaction():
        ids = [r[0] for r in conn.execute("DELETE FROM alert_endpoints WHERE endpoint_id = %s OR url = %s "
                                          "RETURNING endpoint_id", (endpoint, endpoint))]
        if ids:
            conn.execute("UPDATE alert_deliveries SET status = 'cancelled', next_attempt_at = NULL "
                         "WHERE endpoint_id = ANY(%s) AND status = 'pending'", (ids,))
    return bool(ids)


# ---------------------------------------------------------------- thresholds


def set_thresholds(conn: psycopg.Connection, customer_id: str, *, budget: str | None = None,
                   credit: str | None = None, forecast_overspend: bool | None = None,
                   credit_runout_days: int | None = None, now: datetime) -> None:
    """Set the customer's own thresholds; what is not given keeps its earlier value (or the default)."""
    if not customer_id.strip():
        raise AlertError("--customer is empty")
    values = {
        "budget_percents": None if budget is None else percents_text(_percents(budget, "--budget")),
        "credit_percents": None if credit is None else percents_text(_percents(credit, "--credit")),
        "forecast_overspend": forecast_overspend,
        "credit_runout_days": credit_runout_days,
    }
    if credit_runout_days is not None and not 0 <= credit_runout_days <= 366:
        raise AlertError("--credit-runout-days must be between 0 (off) and 366")
    if all(v is None for v in values.values()):
        raise AlertError("give at least one of --budget, --credit, --forecast-overspend/--no-forecast-overspend, "
                         "--credit-runout-days")
    columns = [k for k, v in values.items() if v is not None]
    with conn.transaction():
        conn.execute(
            f"INSERT INTO alert_thresholds (customer_id, {', '.join(columns)}, updated_at) "
            f"VALUES (%(customer)s, {', '.join(f'%({c})s' for c in columns)}, %(now)s) "
            f"ON CONFLICT (customer_id) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in columns)}, "
            "updated_at = EXCLUDED.updated_at",
            {**values, "customer": customer_id, "now": now})


def _percents(text: str, what: str):
    try:
        return parse_percents(text, what)
    except ThresholdError as exc:
        raise AlertError(str(exc)) from None


def clear_thresholds(conn: psycopg.Connection, customer_id: str) -> bool:
    with conn.transaction():
        return conn.execute("DELETE FROM alert_thresholds WHERE customer_id = %s", (customer_id,)).rowcount == 1


def thresholds_for(conn: psycopg.Connection, customer_id: str, defaults: Thresholds) -> tuple[Thresholds, dict]:
    """The customer's thresholds (its own where set, else `defaults`) and, per field, where each comes
    from ("customer" or "default")."""
    row = conn.execute("SELECT budget_percents, credit_percents, forecast_overspend, credit_runout_days "
                       "FROM alert_thresholds WHERE customer_id = %s", (customer_id,)).fetchone()
    own = dict(zip(("budget_percents", "credit_percents", "forecast_overspend", "credit_runout_days"),
                   row or (None, None, None, None), strict=True))
    source = {k: "default" if v is None else "customer" for k, v in own.items()}
    return Thresholds(
        defaults.budget_percents if own["budget_percents"] is None else parse_percents(own["budget_percents"]),
        defaults.credit_percents if own["credit_percents"] is None else parse_percents(own["credit_percents"]),
        defaults.forecast_overspend if own["forecast_overspend"] is None else own["forecast_overspend"],
        defaults.credit_runout_days if own["credit_runout_days"] is None else own["credit_runout_days"],
    ), source


def customers_with_thresholds(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT customer_id FROM alert_thresholds ORDER BY customer_id")]


# ---------------------------------------------------------------- alerts and deliveries


@dataclass(frozen=True)
class Recorded:
    alert_id: str
    deliveries: list[str]  # the delivery ids made for it (one per endpoint)


def body_of(delivery: str, alert: str, crossing: Crossing, fired_at: datetime) -> str:
    """The exact JSON a delivery sends (the same bytes on every attempt; keys sorted, no spaces)."""
    return json.dumps({
        "id": delivery,
        "type": f"alert.{crossing.kind}",
        "created": utc_text(fired_at),
        "alert": {"id": alert, "customer_id": crossing.customer_id, "kind": crossing.kind,
                  "threshold": crossing.threshold, "period": crossing.period, "fired_at": utc_text(fired_at),
                  "data": crossing.data},
    }, sort_keys=True, separators=(",", ":"))


def record(conn: psycopg.Connection, crossing: Crossing, *, now: datetime) -> Recorded | None:
    """Record the alert of `crossing` and a pending delivery to each endpoint taking the customer's
    alerts, in one transaction; None when that alert already fired (the unique key
    (customer, kind, threshold, period) decides, so concurrent evaluations fire it once)."""
    ident = alert_id(*crossing.key)
    with conn.transaction():
        inserted = conn.execute(
            "INSERT INTO alerts (alert_id, customer_id, kind, threshold, period, fired_at, data) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING alert_id",
            (ident, *crossing.key, now, Jsonb(crossing.data))).fetchone()
        if inserted is None:
            return None
        made = []
        for endpoint in endpoints(conn, crossing.customer_id):
            delivery = delivery_id(ident, endpoint.endpoint_id)
            conn.execute(
                "INSERT INTO alert_deliveries (delivery_id, alert_id, endpoint_id, url, body, status, attempts, "
                "created_at, next_attempt_at) VALUES (%s, %s, %s, %s, %s, 'pending', 0, %s, %s)",
                (delivery, ident, endpoint.endpoint_id, endpoint.url, body_of(delivery, ident, crossing, now), now,
                 now))
            made.append(delivery)
    return Recorded(ident, made)


_ALERTS_SQL = """
SELECT a.alert_id, a.customer_id, a.kind, a.threshold, a.period, a.fired_at, a.data,
       coalesce(json_agg(json_build_object(
           'delivery_id', d.delivery_id, 'endpoint_id', d.endpoint_id, 'url', d.url, 'status', d.status,
           'attempts', d.attempts, 'next_attempt_at', d.next_attempt_at, 'last_attempt_at', d.last_attempt_at,
           'delivered_at', d.delivered_at, 'last_status', d.last_status, 'last_error', d.last_error)
         ORDER BY d.created_at, d.delivery_id) FILTER (WHERE d.delivery_id IS NOT NULL), '[]')
FROM alerts a LEFT JOIN alert_deliveries d USING (alert_id)
WHERE %(customer)s::text IS NULL OR a.customer_id = %(customer)s
GROUP BY a.alert_id
ORDER BY a.fired_at DESC, a.alert_id
LIMIT %(limit)s
"""


def _time_text(value: str | None) -> str | None:
    """A timestamp json_build_object wrote (2026-11-20T10:00:00+00:00) as the project writes times."""
    return None if value is None else utc_text(datetime.fromisoformat(value))


def list_alerts(conn: psycopg.Connection, customer_id: str | None = None, *, limit: int = 200) -> list[dict]:
    """Alerts fired, newest first, each with its deliveries: [{"alert_id", "customer_id", "kind",
    "threshold", "period", "fired_at", "data", "deliveries": [{"delivery_id", "endpoint_id", "url",
    "status", "attempts", "next_attempt_at", "last_attempt_at", "delivered_at", "last_status",
    "last_error"}]}]."""
    out = []
    for alert, customer, kind, threshold, period, fired_at, data, deliveries in conn.execute(
            _ALERTS_SQL, {"customer": customer_id, "limit": limit}):
        for d in deliveries:
            for key in ("next_attempt_at", "last_attempt_at", "delivered_at"):
                d[key] = _time_text(d[key])
        out.append({"alert_id": alert, "customer_id": customer, "kind": kind, "threshold": threshold,
                    "period": period, "fired_at": utc_text(fired_at), "data": data, "deliveries": deliveries})
    return out


def alerts_for(conn: psycopg.Connection, customer_id: str, *, limit: int = 100) -> list[dict]:
    """One customer's alerts, newest first, with their deliveries (as `list_alerts`): what the customer
    dashboard shows."""
    return list_alerts(conn, customer_id, limit=limit)

