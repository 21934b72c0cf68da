"""prediction: the fitted predictors' state, one row per fit (prediction_service/tables.py)

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prediction_fits",
        sa.Column("version", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tasks", sa.BigInteger(), nullable=False),
        sa.Column("fit_cpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("state", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("prediction_fits_pkey")),
    )
    op.create_index("prediction_fits_fitted_at", "prediction_fits", ["fitted_at"], unique=False)


def downgrade() -> None:
    op.drop_index("prediction_fits_fitted_at", table_name="prediction_fits")
    op.drop_table("prediction_fits")
