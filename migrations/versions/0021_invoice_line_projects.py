"""billing: invoice lines by project (a price book's `invoice: {group_by: project}`)

Revision ID: 0021
Revises: 0020

A book may lay its invoice lines out by project (docs/pricing.md, "Invoice lines by project"): each
usage line of a request meter becomes one line per project of its usage. billing_invoice_lines and
billing_invoice_lines_replaced gain `project` (text, '' = no project, or a line not split by project);
existing lines get ''. The trigger that keeps a draft's replaced lines (migration 0012) copies the
column too.

Downgrade drops the column (and the trigger copies the columns of 0012 again): lines already split by
project stay as separate lines with their own ids and amounts, but without the project they were for.
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

LINE_COLS_0012 = ("id, rated_line_id, kind, charge_key, meter, grp, quantity, unit_price, precise_amount, amount, "
                  "period, service_period_start, service_period_end")
TABLES = ("billing_invoice_lines", "billing_invoice_lines_replaced")


def _keep_replaced_lines(cols: str) -> str:
    """migration 0012's statement trigger function, copying `cols`."""
    return f"""
CREATE OR REPLACE FUNCTION billing_keep_replaced_lines() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO billing_invoice_lines_replaced (invoice_id, revision, position, {cols})
    SELECT l.invoice_id, i.revision, l.position, {", ".join("l." + c.strip() for c in cols.split(","))}
    FROM billing_lines_replaced l JOIN billing_invoices i ON i.id = l.invoice_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN project text COLLATE \"C\" DEFAULT '' NOT NULL")
    op.execute(_keep_replaced_lines(LINE_COLS_0012 + ", project"))


def downgrade() -> None:
    op.execute(_keep_replaced_lines(LINE_COLS_0012))
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN project")
