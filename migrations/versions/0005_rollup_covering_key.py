"""request rollups: the primary key carries the rated sums (index-only period sums in customer order)

Revision ID: 0005
Revises: 0004

Rating a period sums each customer x model over the period's hours. With the sums in the primary-key
index (INCLUDE), PostgreSQL reads them in customer order from the index alone, without a hash table
over every group, and the rating of one customer can start while the next one is summed
(pricing_service/rate_period.py). Rollup upserts already rewrite the index entry of the row they
change (the heap is full, so they are not HOT updates), so the wider entries cost little on writes.

Operators: this rebuilds the key index while holding the table's exclusive lock (metering writes to
the table wait; `lock_timeout` is 20 s for taking the lock, not for the build). On a large live
table, build the index beforehand without blocking writes and swap it in:

    CREATE UNIQUE INDEX CONCURRENTLY request_rollup_hourly_key_sums ON request_rollup_hourly
        (customer_id, model, deployment_id, hour) INCLUDE (requests, input_tokens, cached_input_tokens, output_tokens);
    ALTER TABLE request_rollup_hourly DROP CONSTRAINT request_rollup_hourly_pkey,
        ADD CONSTRAINT request_rollup_hourly_pkey PRIMARY KEY USING INDEX request_rollup_hourly_key_sums;

then `infermeter db upgrade` finds the key already covering and only records the revision.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

KEY = "customer_id, model, deployment_id, hour"
SUMS = "requests, input_tokens, cached_input_tokens, output_tokens"


def upgrade() -> None:
    if _key_is_covering():  # swapped in by an operator beforehand (see above)
        return
    op.execute(
        "ALTER TABLE request_rollup_hourly DROP CONSTRAINT request_rollup_hourly_pkey, "
        f"ADD CONSTRAINT request_rollup_hourly_pkey PRIMARY KEY ({KEY}) INCLUDE ({SUMS})"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE request_rollup_hourly DROP CONSTRAINT request_rollup_hourly_pkey, "
        f"ADD CONSTRAINT request_rollup_hourly_pkey PRIMARY KEY ({KEY})"
    )


def _key_is_covering() -> bool:
    return bool(op.get_bind().execute(sa.text(
        "SELECT i.indnatts > i.indnkeyatts FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = 'request_rollup_hourly_pkey'"
    )).scalar())
