"""serving: the capacity signal's demand at arrival, shared by the gateways

Revision ID: 0022
Revises: 0020

capacity_arrivals_minutely (serving): per deployment x UTC minute x gateway process, the requests
that gateway admitted and their predicted p50 output tokens (serving/capacity_arrivals_store.py).
Each gateway upserts its own rows with the minute's full counts and every reader sums them over
gateways; rows older than 90 minutes are deleted by the gateways. A new table: nothing is rewritten.
Downgrade drops it (a few minutes of demand at arrival, nothing billed).
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capacity_arrivals_minutely",
        sa.Column("deployment_id", sa.Text(), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gateway_instance", sa.Text(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("predicted_output_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("deployment_id", "minute", "gateway_instance", name="capacity_arrivals_minutely_pkey"),
    )


def downgrade() -> None:
    op.drop_table("capacity_arrivals_minutely")
