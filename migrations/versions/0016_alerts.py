"""alerts: webhook endpoints, per-customer thresholds, alerts fired once per period, their deliveries
(alerts/tables.py)

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_endpoints",
        sa.Column("endpoint_id", sa.Text(collation="C"), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(collation="C"), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("alert_endpoints_pkey")),
        sa.UniqueConstraint("url", "customer_id", name="alert_endpoints_url_customer"),
    )
    op.create_table(
        "alert_thresholds",
        sa.Column("customer_id", sa.Text(collation="C"), nullable=False),
        sa.Column("budget_percents", sa.Text(), nullable=True),
        sa.Column("credit_percents", sa.Text(), nullable=True),
        sa.Column("forecast_overspend", sa.Boolean(), nullable=True),
        sa.Column("credit_runout_days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("alert_thresholds_pkey")),
    )
    op.create_table(
        "alerts",
        sa.Column("alert_id", sa.Text(collation="C"), nullable=False),
        sa.Column("customer_id", sa.Text(collation="C"), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("threshold", sa.Text(), nullable=False),
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint("kind IN ('budget', 'credit', 'forecast_overspend', 'credit_runout', 'test')",
                           name="alerts_kind"),
        sa.PrimaryKeyConstraint("alert_id", name=op.f("alerts_pkey")),
        sa.UniqueConstraint("customer_id", "kind", "threshold", "period", name="alerts_once_per_period"),
    )
    op.create_index("alerts_customer_fired_at", "alerts", ["customer_id", "fired_at"], unique=False)
    op.create_table(
        "alert_deliveries",
        sa.Column("delivery_id", sa.Text(collation="C"), nullable=False),
        sa.Column("alert_id", sa.Text(collation="C"), nullable=False),
        sa.Column("endpoint_id", sa.Text(collation="C"), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed', 'cancelled')",
                           name="alert_deliveries_status"),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.alert_id"], name=op.f("alert_deliveries_alert_id_fkey")),
        sa.PrimaryKeyConstraint("delivery_id", name=op.f("alert_deliveries_pkey")),
        sa.UniqueConstraint("alert_id", "endpoint_id", name="alert_deliveries_once_per_endpoint"),
    )
    op.create_index("alert_deliveries_due", "alert_deliveries", ["next_attempt_at"], unique=False,
                    postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    op.drop_index("alert_deliveries_due", table_name="alert_deliveries", postgresql_where=sa.text("status = 'pending'"))
    op.drop_table("alert_deliveries")
    op.drop_index("alerts_customer_fired_at", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("alert_thresholds")
    op.drop_table("alert_endpoints")
