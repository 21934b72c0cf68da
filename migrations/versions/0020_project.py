"""metering: usage by project (the API key's project on request events, a dimension of the rollups)

Revision ID: 0020
Revises: 0019

`infermeter.request.v1` events carry the project of the API key they were made with (optional
`project`, docs/metering.md). request_rollup_hourly gains `project` (text, '' = no project: events
without one) and its primary key becomes (customer_id, model, deployment_id, hour, project), still
covering the rated sums (migration 0005): the rows of one customer x model x deployment x hour stay
adjacent in the key, so the readers that sum over projects read in the same order as before.
request_period_totals already keys by project (migration 0018). Existing rows get project '': no event
stored before this revision carries one.

Operators: re-keying rebuilds the key index while holding the table's exclusive lock (metering writes
wait); on a large live table build the new index concurrently first and swap it in, as in 0005's
docstring, with the key (customer_id, model, deployment_id, hour, project).

Downgrade adds each hour's per-project rows into its no-project row, then drops the column: the sums
over projects are kept, the split is lost.
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

KEY = "customer_id, model, deployment_id, hour"
SUMS = "requests, input_tokens, cached_input_tokens, output_tokens"
COUNTS = ("requests", "requests_ok", "requests_error", "requests_cancelled", "requests_rejected",
          "input_tokens", "cached_input_tokens", "output_tokens",
          "retry_requests", "retry_input_tokens", "retry_cached_input_tokens", "retry_output_tokens")


def upgrade() -> None:
    op.execute("ALTER TABLE request_rollup_hourly ADD COLUMN project text COLLATE \"C\" DEFAULT '' NOT NULL")
    op.execute(
        "ALTER TABLE request_rollup_hourly DROP CONSTRAINT request_rollup_hourly_pkey, "
        f"ADD CONSTRAINT request_rollup_hourly_pkey PRIMARY KEY ({KEY}, project) INCLUDE ({SUMS})"
    )


def downgrade() -> None:
    counts = ", ".join(COUNTS)
    op.execute(
        f"INSERT INTO request_rollup_hourly AS r ({KEY}, project, {counts}) "
        f"SELECT {KEY}, '', {', '.join(f'sum({c})' for c in COUNTS)} FROM request_rollup_hourly "
        f"WHERE project <> '' GROUP BY {KEY} ORDER BY {KEY} "
        f"ON CONFLICT ({KEY}, project) DO UPDATE SET {', '.join(f'{c} = r.{c} + EXCLUDED.{c}' for c in COUNTS)}"
    )
    op.execute("DELETE FROM request_rollup_hourly WHERE project <> ''")
    op.execute(
        "ALTER TABLE request_rollup_hourly DROP CONSTRAINT request_rollup_hourly_pkey, "
        f"ADD CONSTRAINT request_rollup_hourly_pkey PRIMARY KEY ({KEY}) INCLUDE ({SUMS})"
    )
    op.execute("ALTER TABLE request_rollup_hourly DROP COLUMN project")
