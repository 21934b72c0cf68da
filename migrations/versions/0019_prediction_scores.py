"""metering: admission-time predictions scored at ingest (prediction_scores_hourly)

Revision ID: 0019
Revises: 0018

Request events may carry the prediction made when the gateway admitted them (`data.prediction`,
additive in infermeter.request.v1). The writer scores each against the request's actual outcome in the
same statement as the rollups, per customer x model x hour of event time (metering.prediction_scores,
docs/metering.md). Events stored before this revision are not scored: the table starts empty.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prediction_scores_hourly",
        sa.Column("customer_id", sa.Text(collation="C"), nullable=False),
        sa.Column("model", sa.Text(collation="C"), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        *(sa.Column(n, sa.BigInteger(), server_default="0", nullable=False)
          for n in ("requests", "failures", "abs_error_p50", "under_p90", "under_p99")),
        *(sa.Column(n, sa.Numeric(precision=38, scale=12), server_default="0", nullable=False)
          for n in ("pinball_p90", "pinball_p99", "abs_error_cached_fraction", "brier_failure")),
        sa.PrimaryKeyConstraint("customer_id", "model", "hour", name="prediction_scores_hourly_pkey"),
    )
    op.create_index("prediction_scores_hourly_hour", "prediction_scores_hourly", ["hour"], unique=False)


def downgrade() -> None:
    op.drop_index("prediction_scores_hourly_hour", table_name="prediction_scores_hourly")
    op.drop_table("prediction_scores_hourly")
