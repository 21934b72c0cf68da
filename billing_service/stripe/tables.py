"""The Stripe adapter's own tables (SQLAlchemy Core on the shared `infermeter.db.metadata`).

- `stripe_objects`: every Stripe object the adapter created, by (kind, local id): a customer by
  infermeter customer id, an invoice item by "<invoice id>/<line id>", an invoice by invoice id, and
  the finalize / void steps of an invoice, a credit note by credit note id. A rerun reads it and skips
  what is done.
- `stripe_webhook_events`: every webhook event taken in, by Stripe event id: a replayed event is
  found here and has no second effect.

Migration: migrations/versions/0007_stripe.py.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, PrimaryKeyConstraint, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import Key, metadata

stripe_objects = Table(
    "stripe_objects",
    metadata,
    Column("kind", Key, nullable=False),  # customer | customer_update | invoiceitem | invoice | finalize | void | creditnote
    Column("local_id", Key, nullable=False),
    Column("stripe_id", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("kind", "local_id", name="stripe_objects_pkey"),
)

stripe_webhook_events = Table(
    "stripe_webhook_events",
    metadata,
    Column("event_id", Key, nullable=False),
    Column("type", Text, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("payload", JSONB, nullable=False),
    PrimaryKeyConstraint("event_id", name="stripe_webhook_events_pkey"),
)

TABLES = (stripe_objects, stripe_webhook_events)
