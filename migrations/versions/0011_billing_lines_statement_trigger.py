"""billing: the draft-only check on invoice lines once per statement for inserts and deletes

Revision ID: 0011
Revises: 0010

Migration 0006's `billing_invoice_lines_drafts_only` looked up the invoice's status once per line
(BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW). A billing run writes its lines with COPY (150,000
for 10,000 invoices), and that per-row lookup was a third of the server's time for them
(docs/benchmarks.md, "Billing a month"). Inserts and deletes are now checked once per statement,
AFTER it, with a transition table joined to the invoices: the statement still fails with the same
check_violation and message, and writes nothing, when any of its lines belongs to an invoice that is
not a draft. Updates (the billing service never updates a line) keep the per-row trigger, which also
refuses moving a line to another invoice.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

STATEMENT_CHECK = """
CREATE FUNCTION billing_lines_of_drafts_only_statement() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv text;
    st text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT l.invoice_id, i.status INTO inv, st FROM billing_lines_written l
            LEFT JOIN billing_invoices i ON i.id = l.invoice_id
            WHERE i.status IS DISTINCT FROM 'draft' LIMIT 1;
    ELSE
        SELECT l.invoice_id, i.status INTO inv, st FROM billing_lines_removed l
            LEFT JOIN billing_invoices i ON i.id = l.invoice_id
            WHERE i.status IS DISTINCT FROM 'draft' LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'invoice % is %: the lines of a finalized invoice cannot change', inv, st
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER billing_invoice_lines_drafts_only_insert AFTER INSERT ON billing_invoice_lines
    REFERENCING NEW TABLE AS billing_lines_written
    FOR EACH STATEMENT EXECUTE FUNCTION billing_lines_of_drafts_only_statement();
CREATE TRIGGER billing_invoice_lines_drafts_only_delete AFTER DELETE ON billing_invoice_lines
    REFERENCING OLD TABLE AS billing_lines_removed
    FOR EACH STATEMENT EXECUTE FUNCTION billing_lines_of_drafts_only_statement();
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER billing_invoice_lines_drafts_only ON billing_invoice_lines")
    op.execute("CREATE TRIGGER billing_invoice_lines_drafts_only BEFORE UPDATE ON billing_invoice_lines "
               "FOR EACH ROW EXECUTE FUNCTION billing_lines_of_drafts_only()")
    op.execute(STATEMENT_CHECK)


def downgrade() -> None:
    op.execute("DROP TRIGGER billing_invoice_lines_drafts_only_delete ON billing_invoice_lines")
    op.execute("DROP TRIGGER billing_invoice_lines_drafts_only_insert ON billing_invoice_lines")
    op.execute("DROP FUNCTION billing_lines_of_drafts_only_statement()")
    op.execute("DROP TRIGGER billing_invoice_lines_drafts_only ON billing_invoice_lines")
    op.execute("CREATE TRIGGER billing_invoice_lines_drafts_only BEFORE INSERT OR UPDATE OR DELETE "
               "ON billing_invoice_lines FOR EACH ROW EXECUTE FUNCTION billing_lines_of_drafts_only()")
