"""The predictors' benchmark data: the demo's month (app.demo.generate) written through metering's write
path and billed like the demo (tests/prediction_service use it too)."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime

import psycopg

from infermeter.stack import to_libpq_url
from metering.kafka import Message
from metering.writer import BatchWriter

WRITER_NOW = datetime(2030, 1, 1, tzinfo=UTC)  # metering's clock: every event is in its past


def write_events(db_url: str, events: list[bytes], batch: int = 2000) -> None:
    """Events through metering's write path (BatchWriter), a group of its own (fresh offsets) each call."""
    writer = BatchWriter(to_libpq_url(db_url), group_id=f"prediction-{uuid.uuid4().hex[:8]}", max_bytes=65536,
                         future_tolerance_s=300, clock=lambda: WRITER_NOW)
    offsets = itertools.count()
    try:
        for i in range(0, len(events), batch):
            chunk = events[i:i + batch]
            result = writer.write([Message("events", 0, next(offsets), None, e, {}, None) for e in chunk])
            if result.accepted + result.duplicates != len(chunk):
                raise RuntimeError(f"metering refused events of the demo month: {result}")
    finally:
        writer.close()


def bill_like_the_demo(db_url: str) -> None:
    """The demo's billing set-up: 50 customers on the per-token book from 2026-11-01, cust-002 in
    Asia/Kolkata, cust-003 with prepaid credit; and `no-plan`, a customer without a plan."""
    from app.demo import BILLING_SETUP_AT, CUSTOMERS, NON_UTC_CUSTOMER, PREPAID_CUSTOMER
    from billing_service.run import assign_plan, grant_credits, set_customer
    from pricing_service.books import EXAMPLE_BOOKS_DIR

    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        for k in range(1, CUSTOMERS + 1):
            customer = f"cust-{k:03d}"
            zone = NON_UTC_CUSTOMER[1] if customer == NON_UTC_CUSTOMER[0] else None
            set_customer(conn, customer, now=BILLING_SETUP_AT, name=f"Demo customer {k}", timezone=zone)
            assign_plan(conn, customer, book.read_text(), str(book), "2026-11-01", now=BILLING_SETUP_AT)
            if customer == PREPAID_CUSTOMER[0]:
                grant_credits(conn, customer, PREPAID_CUSTOMER[1], now=BILLING_SETUP_AT, reason="demo top-up")
        set_customer(conn, "no-plan", now=BILLING_SETUP_AT, name="A customer without a plan")
        conn.execute("ANALYZE")


def load_demo_month(db_url: str, limit: int | None, seed: int = 7) -> list[bytes]:
    """The demo month of `limit` trace requests (None: the whole trace, `--full`), metered and billed."""
    from app.demo import generate

    events, _, _ = generate(limit, seed)
    write_events(db_url, events)
    bill_like_the_demo(db_url)
    return events
