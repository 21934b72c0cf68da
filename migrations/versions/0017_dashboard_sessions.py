"""dashboards: the sessions' record, so that signing out ends a session in every process

Revision ID: 0017
Revises: 0016

dashboard_sessions (dashboards/sessions.py): one row per dashboard sign-in, named by the id its signed
cookie carries; signing out sets ended_at, and every process serving the pages checks a request's
session here (through a short cache). Rows expired for a day are deleted at the next sign-in. A new
table: nothing is rewritten. Cookies signed before this revision carry no session id and are sent back
to sign in.
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=True),
        sa.Column("api_key_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('customer', 'admin')", name="dashboard_sessions_kind"),
        sa.PrimaryKeyConstraint("session_id", name="dashboard_sessions_pkey"),
    )
    op.create_index("dashboard_sessions_expires", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("dashboard_sessions_expires", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
