"""stripe adapter state: created Stripe objects and received webhook events

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stripe_objects",
        sa.Column("kind", sa.Text(collation="C"), nullable=False),
        sa.Column("local_id", sa.Text(collation="C"), nullable=False),
        sa.Column("stripe_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("kind", "local_id", name="stripe_objects_pkey"),
    )
    op.create_table(
        "stripe_webhook_events",
        sa.Column("event_id", sa.Text(collation="C"), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name="stripe_webhook_events_pkey"),
    )


def downgrade() -> None:
    op.drop_table("stripe_webhook_events")
    op.drop_table("stripe_objects")
