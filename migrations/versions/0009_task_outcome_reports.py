"""trusted task outcomes: every task outcome report kept with its source

Revision ID: 0009
Revises: 0008

task_outcomes keeps one outcome per task (the latest, from any source). A price book may trust only
some outcome sources (docs/billing.md, "Trusted task outcomes"), so metering also keeps every
report: task_outcome_reports, one row per infermeter.task.v1 event (customer, task, source, event
id), filled here from the task events already in raw_events. task_attempts gains an index on
first_request_at: a task's timeout runs from its first request.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_outcome_reports",
        sa.Column("customer_id", sa.Text(collation="C"), nullable=False),
        sa.Column("task_id", sa.Text(collation="C"), nullable=False),
        sa.Column("source", sa.Text(collation="C"), nullable=False),
        sa.Column("event_id", sa.Text(collation="C"), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("customer_id", "task_id", "source", "event_id", name="task_outcome_reports_pkey"),
    )
    op.create_index("task_outcome_reports_finished", "task_outcome_reports", ["finished_at"], unique=False)
    op.create_index("task_attempts_first_request", "task_attempts", ["first_request_at"], unique=False)
    op.execute(
        "INSERT INTO task_outcome_reports (customer_id, task_id, source, event_id, outcome, finished_at) "
        "SELECT customer_id, payload->'data'->>'task_id', source, event_id, payload->'data'->>'outcome', "
        "(payload->'data'->>'finished_at')::timestamptz FROM raw_events WHERE type = 'infermeter.task.v1' "
        "ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.drop_index("task_attempts_first_request", table_name="task_attempts")
    op.drop_index("task_outcome_reports_finished", table_name="task_outcome_reports")
    op.drop_table("task_outcome_reports")
