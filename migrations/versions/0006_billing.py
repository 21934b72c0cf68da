"""billing: customers, plans, invoices, history, numbers, prepaid credits, credit notes

Revision ID: 0006
Revises: 0005

Besides the tables (billing_service/tables.py), triggers make the database itself refuse what the
billing service never does (docs/billing.md, "What the database enforces"):
- the lines of an invoice that is not a draft cannot be inserted, changed or deleted;
- a finalized invoice keeps its amounts, number, period and book: only its status moves (and its
  revision and updated_at with it), and it is never deleted;
- the invoice history, the credit ledger, credit notes and stored price books are append-only.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TRIGGERS = """
CREATE FUNCTION billing_lines_of_drafts_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv text := CASE WHEN TG_OP = 'DELETE' THEN OLD.invoice_id ELSE NEW.invoice_id END;
    st text;
BEGIN
    SELECT status INTO st FROM billing_invoices WHERE id = inv;
    IF st IS DISTINCT FROM 'draft' THEN
        RAISE EXCEPTION 'invoice % is %: the lines of a finalized invoice cannot change', inv, st
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.invoice_id IS DISTINCT FROM NEW.invoice_id THEN
        RAISE EXCEPTION 'invoice lines cannot move to another invoice' USING ERRCODE = 'check_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER billing_invoice_lines_drafts_only BEFORE INSERT OR UPDATE OR DELETE ON billing_invoice_lines
    FOR EACH ROW EXECUTE FUNCTION billing_lines_of_drafts_only();

CREATE FUNCTION billing_finalized_invoice_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'draft' THEN
        IF TG_OP = 'DELETE' THEN
            RAISE EXCEPTION 'invoice % is %: a finalized invoice is never deleted', OLD.id, OLD.status
                USING ERRCODE = 'check_violation';
        END IF;
        IF (NEW.id, NEW.customer_id, NEW.period, NEW.period_start, NEW.period_end, NEW.sequence, NEW.currency,
            NEW.subtotal, NEW.credits_applied, NEW.total, NEW.price_book_version, NEW.book_sha256, NEW.number,
            NEW.issued_at, NEW.finalized_at, NEW.reissue_of, NEW.created_at)
           IS DISTINCT FROM
           (OLD.id, OLD.customer_id, OLD.period, OLD.period_start, OLD.period_end, OLD.sequence, OLD.currency,
            OLD.subtotal, OLD.credits_applied, OLD.total, OLD.price_book_version, OLD.book_sha256, OLD.number,
            OLD.issued_at, OLD.finalized_at, OLD.reissue_of, OLD.created_at) THEN
            RAISE EXCEPTION 'invoice % (%) is %: a finalized invoice is immutable, only its status moves',
                OLD.id, OLD.number, OLD.status USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER billing_invoices_frozen BEFORE UPDATE OR DELETE ON billing_invoices
    FOR EACH ROW EXECUTE FUNCTION billing_finalized_invoice_frozen();

CREATE FUNCTION billing_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: rows are never changed or deleted', TG_TABLE_NAME
        USING ERRCODE = 'check_violation';
END $$;
"""
APPEND_ONLY = ("billing_invoice_history", "billing_credit_ledger", "billing_credit_notes", "billing_price_books")


def upgrade() -> None:
    op.create_table('billing_customers',
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('email', sa.Text(), nullable=True),
    sa.Column('timezone', sa.Text(), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('anchor_day', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('customer_id', name='billing_customers_pkey')
    )
    op.create_table('billing_invoice_history',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('invoice_id', sa.Text(collation='C'), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('change', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('document', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('billing_invoice_history_pkey')),
    sa.UniqueConstraint('invoice_id', 'revision', name='billing_invoice_history_revision')
    )
    op.create_table('billing_number_counters',
    sa.Column('prefix', sa.Text(collation='C'), nullable=False),
    sa.Column('year', sa.Integer(), nullable=False),
    sa.Column('last_seq', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('prefix', 'year', name='billing_number_counters_pkey')
    )
    op.create_table('billing_price_books',
    sa.Column('sha256', sa.Text(collation='C'), nullable=False),
    sa.Column('book_id', sa.Text(collation='C'), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('document', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('source_text', sa.Text(), nullable=False),
    sa.Column('source_name', sa.Text(), nullable=False),
    sa.Column('stored_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name='billing_price_books_pkey')
    )
    op.create_table('billing_credit_grants',
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('amount', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['customer_id'], ['billing_customers.customer_id'], name=op.f('billing_credit_grants_customer_id_fkey')),
    sa.PrimaryKeyConstraint('id', name='billing_credit_grants_pkey')
    )
    op.create_index('billing_credit_grants_customer', 'billing_credit_grants', ['customer_id'], unique=False)
    op.create_table('billing_invoices',
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('period', sa.Text(), nullable=False),
    sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('period_end', sa.DateTime(timezone=True), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('subtotal', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('credits_applied', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('total', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('price_book_version', sa.Text(), nullable=False),
    sa.Column('book_sha256', sa.Text(collation='C'), nullable=True),
    sa.Column('number', sa.Text(collation='C'), nullable=True),
    sa.Column('issued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finalized_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reissue_of', sa.Text(collation='C'), nullable=True),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['book_sha256'], ['billing_price_books.sha256'], name=op.f('billing_invoices_book_sha256_fkey')),
    sa.ForeignKeyConstraint(['customer_id'], ['billing_customers.customer_id'], name=op.f('billing_invoices_customer_id_fkey')),
    sa.PrimaryKeyConstraint('id', name='billing_invoices_pkey'),
    sa.UniqueConstraint('customer_id', 'period', 'sequence', name='billing_invoices_customer_period_seq'),
    sa.UniqueConstraint('number', name='billing_invoices_number')
    )
    op.create_index('billing_invoices_period', 'billing_invoices', ['period', 'status'], unique=False)
    op.create_table('billing_plans',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('from_date', sa.Date(), nullable=False),
    sa.Column('effective_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('effective_period', sa.Text(), nullable=False),
    sa.Column('book_sha256', sa.Text(collation='C'), nullable=False),
    sa.Column('assigned_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['book_sha256'], ['billing_price_books.sha256'], name=op.f('billing_plans_book_sha256_fkey')),
    sa.ForeignKeyConstraint(['customer_id'], ['billing_customers.customer_id'], name=op.f('billing_plans_customer_id_fkey')),
    sa.PrimaryKeyConstraint('id', name=op.f('billing_plans_pkey'))
    )
    op.create_index('billing_plans_customer', 'billing_plans', ['customer_id', 'effective_at'], unique=False)
    op.create_table('billing_credit_ledger',
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('grant_id', sa.Text(collation='C'), nullable=False),
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('amount', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('invoice_id', sa.Text(collation='C'), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['grant_id'], ['billing_credit_grants.id'], name=op.f('billing_credit_ledger_grant_id_fkey')),
    sa.PrimaryKeyConstraint('id', name='billing_credit_ledger_pkey')
    )
    op.create_index('billing_credit_ledger_customer', 'billing_credit_ledger', ['customer_id'], unique=False)
    op.create_table('billing_credit_notes',
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('number', sa.Text(collation='C'), nullable=False),
    sa.Column('invoice_id', sa.Text(collation='C'), nullable=False),
    sa.Column('customer_id', sa.Text(collation='C'), nullable=False),
    sa.Column('currency', sa.Text(), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('total', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('refund_amount', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('credits_returned', sa.Numeric(precision=38, scale=12), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('issued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('lines', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['invoice_id'], ['billing_invoices.id'], name=op.f('billing_credit_notes_invoice_id_fkey')),
    sa.PrimaryKeyConstraint('id', name='billing_credit_notes_pkey'),
    sa.UniqueConstraint('invoice_id', 'sequence', name='billing_credit_notes_invoice_seq'),
    sa.UniqueConstraint('number', name='billing_credit_notes_number')
    )
    op.create_table('billing_invoice_lines',
    sa.Column('invoice_id', sa.Text(collation='C'), nullable=False),
    sa.Column('id', sa.Text(collation='C'), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
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
    sa.ForeignKeyConstraint(['invoice_id'], ['billing_invoices.id'], name=op.f('billing_invoice_lines_invoice_id_fkey')),
    sa.PrimaryKeyConstraint('invoice_id', 'id', name='billing_invoice_lines_pkey')
    )

    op.execute(TRIGGERS)
    for table in APPEND_ONLY:
        op.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION billing_append_only()")


def downgrade() -> None:
    for table in APPEND_ONLY:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    op.execute("DROP TRIGGER IF EXISTS billing_invoices_frozen ON billing_invoices")
    op.execute("DROP TRIGGER IF EXISTS billing_invoice_lines_drafts_only ON billing_invoice_lines")
    op.drop_table('billing_invoice_lines')
    op.drop_table('billing_credit_notes')
    op.drop_index('billing_credit_ledger_customer', table_name='billing_credit_ledger')
    op.drop_table('billing_credit_ledger')
    op.drop_index('billing_plans_customer', table_name='billing_plans')
    op.drop_table('billing_plans')
    op.drop_index('billing_invoices_period', table_name='billing_invoices')
    op.drop_table('billing_invoices')
    op.drop_index('billing_credit_grants_customer', table_name='billing_credit_grants')
    op.drop_table('billing_credit_grants')
    op.drop_table('billing_price_books')
    op.drop_table('billing_number_counters')
    op.drop_table('billing_invoice_history')
    op.drop_table('billing_customers')

    for function in ("billing_append_only", "billing_finalized_invoice_frozen", "billing_lines_of_drafts_only"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
