"""Billing's adapters: the billing domain (`billing/`, pure) made to run on PostgreSQL and metering.

- `tables`: customers, plans (price books as immutable sha256 snapshots), invoices and their lines, the
  append-only invoice history, gapless number counters, prepaid credit grants and ledger, credit notes.
- `store`: psycopg adapters implementing `billing.ports` (invoice store, credit ledger, numbers).
- `usage`: a customer-period's `pricing.usage.Usage` from metering's reads (edge hours from raw events).
- `run`: the billing run (drafts, refresh in the grace window, finalization, adjustments, credits),
  preview, void/reissue, credit notes and `reconcile_money`; it owns the transactions, the clock is injected.
- `cli`: `infermeter customers|plans|billing|invoices|invoice|credits ...`; `api`: the HTTP router.

See docs/billing.md.
"""
