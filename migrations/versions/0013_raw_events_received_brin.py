"""metering: a BRIN index on raw_events.received_at, for the operations page's arrival-time reads

Revision ID: 0013
Revises: 0012

The operations page (`metering.ops_reads.ingest_rate`, `metering.ops_reads.metering_delay`) reads the
events that arrived in the last hour by `received_at`. raw_events is partitioned and BRIN-indexed by
event time only, so those reads scanned every recent partition whole: on 3,000,000 events of one month
the two reads took 200-260 ms, with this index 1.0-1.5 ms (`python -m bench.arrival_reads`,
docs/benchmarks.md, "Arrival-time reads"). Rows are written in arrival order, so block ranges of
`received_at` are tight and the index stays tiny; the write path's rate with it was 0.97-1.03x the
rate without it in the same run (noise).
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("raw_events_received_brin", "raw_events", ["received_at"], unique=False, postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("raw_events_received_brin", table_name="raw_events")
