"""The Stripe adapter: finalized invoices and their credit notes pushed to Stripe, Stripe's webhooks
turned into payment statuses. See docs/billing-stripe.md.

- `sync`: `StripeSync(client, state)`, one customer, invoice or credit note pushed with idempotency keys;
- `state`: what was pushed (`SyncState`) and the webhook events taken in (`WebhookEventLog`), in
  memory or in PostgreSQL (`tables`: `stripe_objects`, `stripe_webhook_events`);
- `run`: which invoices and credit notes to push (`sync_invoices`), what is in sync (`sync_status`,
  `credit_note_status`), and the webhook's status port (`status_port`);
- `webhook`: the signature check and `WebhookHandler`; `api`: the router, `POST /v1/stripe/webhook`.

Only billing's CLI, the roof (`app`) and the migrations' models import this package, and nothing
else in the project imports the Stripe SDK (import-linter contracts `stripe-adapter`, `stripe-sdk`).
"""
