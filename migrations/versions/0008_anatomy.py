"""cost anatomy: the engine state of replica intervals in the GPU ledger, task failure causes

Revision ID: 0008
Revises: 0007

gpu_ledger_hourly gains wall_ms, kv_cache_gpu_ms, queue_ms and running_ms (bigint, default 0: rows
written before carry no engine state), summed like the other counters; task_outcomes gains the
outcome's optional failure_cause. docs/cost-model.md ("Cost anatomy") reads them. Adding columns with
a constant default does not rewrite the tables.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

LEDGER_COLUMNS = ("wall_ms", "kv_cache_gpu_ms", "queue_ms", "running_ms")


def upgrade() -> None:
    for name in LEDGER_COLUMNS:
        op.add_column("gpu_ledger_hourly", sa.Column(name, sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("task_outcomes", sa.Column("failure_cause", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_outcomes", "failure_cause")
    for name in reversed(LEDGER_COLUMNS):
        op.drop_column("gpu_ledger_hourly", name)
