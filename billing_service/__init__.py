"""Billing's adapters: the billing domain (`billing/`, pure) made to run on PostgreSQL and metering.

- `tables`: customers, plans (price books as immutable sha256 snapshots), invoices and their lines, the
  append-only invoice history, gapless number counters, prepaid credit grants and ledger, credit notes.
- `store`: psycopg adapters (customers, plans, invoice store, credit ledger, numbers).
- `usage`: a customer-period's `pricing.usage.Usage` from metering's reads (edge hours from raw events),
  and usage no invoice carries (unbilled).
- `customers`: customer records and plan assignments (which price book from which local date).
- `run`: the billing run (drafts, refresh in the grace window, finalization with credits), per customer
  and in bulk (`batch`: the bulk path's in-memory store, ledger and numbers, written with COPY);
  `drafts`: a draft's lines (the period's rating minus what is invoiced already, adjustments).
- `invoices`: preview, list, show, void and reissue, payment status; `credits`: prepaid credits and
  credit notes; `reconcile`: `reconcile_money`. Each owns its transactions; the clock is injected.
- `exports`: finance exports (invoices, lines, revenue, usage) as CSV or Parquet, as of any past moment.
- `stripe/`: the Stripe adapter (sync, state, tables, webhooks, router); `stripe.run` decides which invoices
  to push, reports what is in sync, and is the webhook's status port (`invoices.record_payment_status`).
  Only the CLI (and the roof, and the migrations' models) import it: billing itself works without Stripe.
- `cli`: `infermeter customers|plans|billing|invoices|invoice|credits|stripe|export ...`; `api`: the HTTP router.

See docs/billing.md.
"""
