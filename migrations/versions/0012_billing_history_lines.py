"""billing: history documents without lines (replaced lines kept instead); lines checked per statement, no FK

Revision ID: 0012
Revises: 0011

Two changes to how a billing run stores an invoice (docs/billing.md, "How invoices are stored";
measured in docs/benchmarks.md, "Billing a month"):

1. History rows stop repeating the lines. Until now every history row held the whole invoice with its
   lines as JSONB (~6.7 kB for 15 lines), so an invoice created and finalized in one run wrote its
   lines three times (the lines table, then two documents). A revision's lines are now the invoice's
   lines as they were when the revision was the latest: the current rows of billing_invoice_lines,
   unless they were replaced since. Lines are only ever replaced by deleting a draft's lines, so the
   database keeps what it deletes: an AFTER DELETE statement trigger copies the removed lines into the
   append-only billing_invoice_lines_replaced, under the revision the invoice had when they were
   removed (the last revision they belonged to). The lines of revision r of an invoice are then those
   replaced under the smallest revision >= r, else its current lines (`store.revision_lines`). Lines
   are never updated in place any more (only replaced), so nothing changes them without that copy.
   Documents written before this migration keep their "lines" and are read as they are.

2. The foreign key billing_invoice_lines.invoice_id -> billing_invoices.id ran its referential check
   once per inserted line (a lookup and a row lock in billing_invoices): for the 150,000 lines of a
   run of 10,000 customers, about half of the server's time for them after migration 0011. The same
   guarantees now come from checks that run once per statement or only when the rare thing happens:
   an inserted line whose invoice does not exist is refused by migration 0011's statement check (a
   missing invoice is not a draft); an invoice that still has lines is never deleted and an invoice's
   id never changes (per-row triggers on billing_invoices that fire only for those operations, which
   the billing service never does).
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

LINE_COLS = ("id, rated_line_id, kind, charge_key, meter, grp, quantity, unit_price, precise_amount, amount, period, "
             "service_period_start, service_period_end")

TRIGGERS = f"""
CREATE FUNCTION billing_keep_replaced_lines() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO billing_invoice_lines_replaced (invoice_id, revision, position, {LINE_COLS})
    SELECT l.invoice_id, i.revision, l.position, {", ".join("l." + c.strip() for c in LINE_COLS.split(","))}
    FROM billing_lines_replaced l JOIN billing_invoices i ON i.id = l.invoice_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER billing_invoice_lines_keep_replaced AFTER DELETE ON billing_invoice_lines
    REFERENCING OLD TABLE AS billing_lines_replaced
    FOR EACH STATEMENT EXECUTE FUNCTION billing_keep_replaced_lines();

CREATE FUNCTION billing_lines_never_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'invoice % line %: invoice lines are never updated (a draft''s lines are replaced, a '
        'finalized invoice''s never change)', OLD.invoice_id, OLD.id USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER billing_invoice_lines_never_updated BEFORE UPDATE ON billing_invoice_lines
    FOR EACH ROW EXECUTE FUNCTION billing_lines_never_updated();

CREATE FUNCTION billing_invoice_keeps_its_lines() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'invoice % cannot be renamed to %: an invoice id never changes', OLD.id, NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM billing_invoice_lines WHERE invoice_id = OLD.id) THEN
        RAISE EXCEPTION 'invoice % has lines: it cannot be deleted', OLD.id USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER billing_invoices_keep_lines_delete BEFORE DELETE ON billing_invoices
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_keeps_its_lines();
CREATE TRIGGER billing_invoices_keep_lines_rename BEFORE UPDATE OF id ON billing_invoices
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION billing_invoice_keeps_its_lines();
"""


def upgrade() -> None:
    op.create_table('billing_invoice_lines_replaced',
    sa.Column('invoice_id', sa.Text(collation='C'), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('rated_line_id', sa.Text(collation='C'), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('charge_key', sa.Text(), nullable=False),
    sa.Column('meter', sa.Text(), nullable=False),
    sa.Column('grp', sa.Text(), nullable=False),
    sa.Column('quantity', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('unit_price', sa.Numeric(precision=38, scale=12), nullable=True),
    sa.Column('precise_amount', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('amount', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('period', sa.Text(), nullable=False),
    sa.Column('service_period_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('service_period_end', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('invoice_id', 'revision', 'id', name='billing_invoice_lines_replaced_pkey')
    )
    op.execute("CREATE TRIGGER billing_invoice_lines_replaced_append_only BEFORE UPDATE OR DELETE "
               "ON billing_invoice_lines_replaced FOR EACH ROW EXECUTE FUNCTION billing_append_only()")
    op.drop_constraint("billing_invoice_lines_invoice_id_fkey", "billing_invoice_lines", type_="foreignkey")
    op.execute("DROP TRIGGER billing_invoice_lines_drafts_only ON billing_invoice_lines")
    op.execute(TRIGGERS)


def downgrade() -> None:
    op.execute("DROP TRIGGER billing_invoices_keep_lines_rename ON billing_invoices")
    op.execute("DROP TRIGGER billing_invoices_keep_lines_delete ON billing_invoices")
    op.execute("DROP FUNCTION billing_invoice_keeps_its_lines()")
    op.execute("DROP TRIGGER billing_invoice_lines_never_updated ON billing_invoice_lines")
    op.execute("DROP FUNCTION billing_lines_never_updated()")
    op.execute("DROP TRIGGER billing_invoice_lines_keep_replaced ON billing_invoice_lines")
    op.execute("DROP FUNCTION billing_keep_replaced_lines()")
    op.execute("CREATE TRIGGER billing_invoice_lines_drafts_only BEFORE UPDATE ON billing_invoice_lines "
               "FOR EACH ROW EXECUTE FUNCTION billing_lines_of_drafts_only()")
    op.create_foreign_key("billing_invoice_lines_invoice_id_fkey", "billing_invoice_lines", "billing_invoices",
                          ["invoice_id"], ["id"])
    op.execute("DROP TRIGGER billing_invoice_lines_replaced_append_only ON billing_invoice_lines_replaced")
    op.drop_table('billing_invoice_lines_replaced')
