"""The alerts' tables (SQLAlchemy Core); Alembic revision 0016 creates exactly them.

- `alert_endpoints`: webhook endpoints: url, the per-endpoint signing secret, and the customer whose
  alerts it receives (`''`: every customer's).
- `alert_thresholds`: a customer's own thresholds; a NULL column takes the setting's default.
- `alerts`: one row per alert fired, unique per (customer, kind, threshold, period): an alert fires
  once per period whatever evaluates it, how often, or in how many processes.
- `alert_deliveries`: one row per (alert, endpoint): its stable id (what the receiver sees on every
  attempt), the exact body sent, its status (pending, delivered, failed, cancelled), attempts, when
  the next one is due, and what the last one got.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import Key, metadata, timestamp_column

alert_endpoints = Table(
    "alert_endpoints",
    metadata,
    Column("endpoint_id", Key, primary_key=True),
    Column("url", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("customer_id", Key, nullable=False, server_default=""),
    timestamp_column("created_at", nullable=False, server_default=text("now()")),
    timestamp_column("updated_at", nullable=False, server_default=text("now()")),
    UniqueConstraint("url", "customer_id", name="alert_endpoints_url_customer"),
)

alert_thresholds = Table(
    "alert_thresholds",
    metadata,
    Column("customer_id", Key, primary_key=True),
    Column("budget_percents", Text),
    Column("credit_percents", Text),
    Column("forecast_overspend", Boolean),
    Column("credit_runout_days", Integer),
    timestamp_column("updated_at", nullable=False, server_default=text("now()")),
)

alerts = Table(
    "alerts",
    metadata,
    Column("alert_id", Key, primary_key=True),
    Column("customer_id", Key, nullable=False),
    Column("kind", Text, nullable=False),
    Column("threshold", Text, nullable=False),
    Column("period", Text, nullable=False),
    timestamp_column("fired_at", nullable=False),
    Column("data", JSONB, nullable=False),
    UniqueConstraint("customer_id", "kind", "threshold", "period", name="alerts_once_per_period"),
    CheckConstraint("kind IN ('budget', 'credit', 'forecast_overspend', 'credit_runout', 'test')",
                    name="alerts_kind"),
)
Index("alerts_customer_fired_at", alerts.c.customer_id, alerts.c.fired_at)

alert_deliveries = Table(
    "alert_deliveries",
    metadata,
    Column("delivery_id", Key, primary_key=True),
    Column("alert_id", Key, ForeignKey("alerts.alert_id"), nullable=False),
    Column("endpoint_id", Key, nullable=False),
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    timestamp_column("created_at", nullable=False),
    timestamp_column("next_attempt_at"),
    timestamp_column("last_attempt_at"),
    timestamp_column("delivered_at"),
    Column("last_status", Integer),
    Column("last_error", Text),
    UniqueConstraint("alert_id", "endpoint_id", name="alert_deliveries_once_per_endpoint"),
    CheckConstraint("status IN ('pending', 'delivered', 'failed', 'cancelled')", name="alert_deliveries_status"),
)
Index("alert_deliveries_due", alert_deliveries.c.next_attempt_at, postgresql_where=text("status = 'pending'"))
