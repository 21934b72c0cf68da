"""Billing, the pure domain: billing periods, invoices, adjustments, credit notes, prepaid credits,
invoice numbers and Stripe keys. No I/O library is imported anywhere in this package
(tests/billing/test_purity.py checks it), and nothing from the project but `pricing`.

Money is computed in one place only, `pricing.rating`: its stable line ids and its one rounding
(per line, half-up, to the currency's minor unit). Billing consumes `Rating`/`Line` values and only
copies, adds and subtracts amounts rating already rounded, so every invoice of a period plus its
adjustments equals the rating of the period, exactly.

- `billing.periods`: `billing_period(label, timezone, anchor_day)`, `period_containing`, `next_period`,
  `split_hours` (partial UTC hours at edges in +05:30/+05:45 zones), `whole_hours`.
- `billing.invoice`: `Invoice`, `InvoiceLine`, `InvoiceStatus` and the `TRANSITIONS` table, deterministic
  ids (`invoice_id`, `adjustment_line_id`); `billing.invoice.drafts`: `draft_from_rating` (and
  `first_invoice`: the same `Invoice`, without re-running checks already done, for the bulk billing run)
  and a draft's changes; `billing.invoice.states`: `transition`/`finalize`/`void`/`reissue` (and
  `finalize_first`, the bulk run's `finalize`); `billing.invoice.adjustments`: `adjustment_lines`,
  `invoiced_lines`.
- `billing.credit_notes`: `CreditNote`, `credit_note` (whole invoice, by line, or amounts), `credit_note_id`.
- `billing.credits`: `CreditGrant`, the ledger (`LedgerEntry`: grant/use/expiry), `apply_credits`, `balance`.
- `billing.numbering`: `format_number`/`parse_number` ("INV-2026-000123"), `gaps`.
- `billing.stripe_keys`: `to_minor_units`, idempotency keys from invoice and line ids.
- `billing.errors`: `BillingError(ValueError)` and its subclasses; messages say what to do.

Domain / adapter split: this package decides; the adapters (`billing_service`) do the I/O: the
invoice and ledger tables and the gapless number counter (database), pushing invoices with
idempotency keys (Stripe), exports, the CLI and the API. Time comes in as `at`/`now` arguments,
never from the system clock, so every decision is reproducible.
"""
