"""data residency: the regions a customer may be served in, and request usage by region

Revision ID: 0010
Revises: 0009

customer_residency (serving): one row per restricted customer with its allowed regions (no row:
unrestricted). request_region_hourly (metering): the request events that carry a region, per
customer x model x deployment x region x hour; events without one stay in request_rollup_hourly
only (the difference is the "no region" share). Both are new tables: nothing is rewritten.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

C = "C"


def upgrade() -> None:
    op.create_table(
        "customer_residency",
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("regions", sa.ARRAY(sa.Text()), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("customer_id"),
    )
    counts = [
        sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)
        for name in ("requests", "requests_rejected", "input_tokens", "cached_input_tokens", "output_tokens")
    ]
    op.create_table(
        "request_region_hourly",
        sa.Column("customer_id", sa.Text(collation=C), nullable=False),
        sa.Column("model", sa.Text(collation=C), nullable=False),
        sa.Column("deployment_id", sa.Text(collation=C), nullable=False),
        sa.Column("region", sa.Text(collation=C), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        *counts,
        sa.PrimaryKeyConstraint(
            "customer_id", "model", "deployment_id", "region", "hour", name="request_region_hourly_pkey"
        ),
    )
    op.create_index("request_region_hourly_hour", "request_region_hourly", ["hour"])


def downgrade() -> None:
    op.drop_index("request_region_hourly_hour", table_name="request_region_hourly")
    op.drop_table("request_region_hourly")
    op.drop_table("customer_residency")
