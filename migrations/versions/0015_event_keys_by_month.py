"""metering: event_keys partitioned by month of event time, like raw_events; archived_months

Revision ID: 0015
Revises: 0014

event_keys held every (source, id) ever accepted in one index, forever. It becomes partitioned by
RANGE (occurred_at), one partition per UTC month (`event_keys_YYYY_MM`, created by the writer
together with raw_events' partition of the month), each with its own primary key (source,
event_id). The writer's `INSERT ... ON CONFLICT DO NOTHING` (no conflict target) takes the leaf
partition's key as its arbiter, so identity is (source, id) within a month of event time, and a
month's keys leave the store with its raw events (`infermeter metering archive`; docs/metering.md,
"Retention and archives"). archived_months records each month archived and dropped.

Existing keys are moved in this migration's one transaction:
1. the old table is locked against writes (SHARE: metering's writers wait, readers go on) and
   renamed;
2. the new partitioned table gets a partition for every month of raw_events' partitions and of the
   stored keys;
3. the rows are routed into those partitions by ONE scan of the old table (it has no index on
   occurred_at, so a SELECT per month would read it whole once per month), with the partitions
   still without their key; then each partition's key is built from its rows, month by month (a
   sorted index build instead of row-by-row inserts into a growing index);
4. the old table is dropped.
Metering's writers wait for the whole migration (measured on the project's 2-core machine while
other work kept it at load average 9-11: 2,000,000 keys over 12 months in 33 s; moving 1,000,000
keys took 12.4-14.0 s this way, 13.5-17.6 s with a SELECT per month, and 13.7-25.7 s when inserting
month by month into partitions that already had their key).

Downgrade puts the keys back into one table with the key (source, event_id): a (source, id) stored
in two months (a producer that reused an id with another event time) keeps its oldest row only.
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

COLUMNS = 'source text COLLATE "C" NOT NULL, event_id text COLLATE "C" NOT NULL, occurred_at timestamptz NOT NULL'

# Every month with keys or with a raw_events partition (its lower bound), as UTC month starts.
MONTHS_SQL = r"""
SELECT month FROM (
    SELECT DISTINCT date_trunc('month', occurred_at, 'UTC') AS month FROM event_keys_unpartitioned
    UNION
    SELECT date_trunc('month', (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]
                                ::timestamptz, 'UTC')
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'raw_events'::regclass
) months WHERE month IS NOT NULL ORDER BY month
"""


def upgrade() -> None:
    op.create_table(
        "archived_months",
        sa.Column("month", sa.DateTime(timezone=True), nullable=False),
        sa.Column("file", sa.Text(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("key_checksum", sa.Text(), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("month", name="archived_months_pkey"),
    )
    op.execute("LOCK TABLE event_keys IN SHARE MODE")
    op.execute("ALTER TABLE event_keys RENAME TO event_keys_unpartitioned")
    op.execute(f"CREATE TABLE event_keys ({COLUMNS}) PARTITION BY RANGE (occurred_at)")
    bind = op.get_bind()
    bind.execute(sa.text("SET LOCAL TIME ZONE 'UTC'"))  # month starts come back as UTC instants
    months = [row[0] for row in bind.execute(sa.text(MONTHS_SQL))]
    for month in months:
        op.execute(
            f"CREATE TABLE {_partition(month)} PARTITION OF event_keys "
            f"FOR VALUES FROM ('{month.isoformat()}') TO ('{_next(month).isoformat()}')"
        )
    op.execute("INSERT INTO event_keys (source, event_id, occurred_at) "
               "SELECT source, event_id, occurred_at FROM event_keys_unpartitioned")
    for month in months:
        name = _partition(month)
        op.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_pkey PRIMARY KEY (source, event_id)")
    op.execute("DROP TABLE event_keys_unpartitioned")


def downgrade() -> None:
    op.drop_table("archived_months")
    op.execute("LOCK TABLE event_keys IN SHARE MODE")
    op.execute("ALTER TABLE event_keys RENAME TO event_keys_by_month")
    op.execute(f"CREATE TABLE event_keys ({COLUMNS})")
    op.execute("INSERT INTO event_keys (source, event_id, occurred_at) "
               "SELECT DISTINCT ON (source, event_id) source, event_id, occurred_at FROM event_keys_by_month "
               "ORDER BY source, event_id, occurred_at")
    op.execute("ALTER TABLE event_keys ADD CONSTRAINT event_keys_pkey PRIMARY KEY (source, event_id)")
    op.execute("DROP TABLE event_keys_by_month")  # with its partitions


def _partition(month) -> str:
    return f"event_keys_{month:%Y_%m}"


def _next(month):
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)
