"""Where the Stripe adapter remembers what it already did: created objects and received webhook events.

`SyncState` (the created Stripe objects, by kind and local id) and `WebhookEventLog` (webhook events
by Stripe event id) are Protocols with two implementations each: in memory (tests, one process) and
PostgreSQL (`billing_service/stripe/tables.py`: `stripe_objects`, `stripe_webhook_events`).

Kinds of `SyncState` records (local ids):
- `customer`: infermeter customer id -> `cus_...`
- `invoiceitem`: "<invoice id>/<line id>" -> `ii_...`
- `invoice`: invoice id -> `in_...`
- `finalize`, `void`: invoice id -> the `in_...` that was finalized / voided (a step done, not an object)
- `creditnote`: credit note id -> `cn_...` (its Stripe credit note)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from billing_service.stripe.tables import stripe_objects, stripe_webhook_events

# customer_update: the local id is "<customer id>@<push>" (0 when the customer was created, then 1, 2, ...),
# recorded once that push of the name and e-mail is in Stripe; its key ends with their version
KINDS = ("customer", "customer_update", "invoiceitem", "invoice", "finalize", "void", "creditnote")


class SyncStateConflict(RuntimeError):
    """A (kind, local id) is already recorded with another Stripe id or idempotency key: two Stripe
    objects claim the same local object. Nothing is overwritten; look at both in the Stripe dashboard."""


@dataclass(frozen=True)
class StripeRecord:
    kind: str
    local_id: str
    stripe_id: str
    idempotency_key: str


class SyncState(Protocol):
    def get(self, kind: str, local_id: str) -> StripeRecord | None: ...

    def record(self, kind: str, local_id: str, stripe_id: str, idempotency_key: str) -> None:
        """Remember a created object (or a done step). The same record again is a no-op; another
        stripe_id or key for the same (kind, local_id) raises SyncStateConflict."""
        ...


class WebhookEventLog(Protocol):
    def claim(
        self, event_id: str, type: str, payload: dict[str, Any], received_at: datetime
    ) -> contextlib.AbstractContextManager[bool]:
        """A context manager yielding True the first time `event_id` is seen, False for a replay.
        The event counts as taken in only when the block exits without an exception: if the caller's
        work raises, the event is not recorded and a redelivery is processed again. Concurrent
        deliveries of one event: at most one block gets True."""
        ...


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown stripe object kind {kind!r} (one of {', '.join(KINDS)})")


def _same(existing: StripeRecord, stripe_id: str, idempotency_key: str) -> None:
    if (existing.stripe_id, existing.idempotency_key) != (stripe_id, idempotency_key):
        raise SyncStateConflict(
            f"{existing.kind} {existing.local_id} is recorded as {existing.stripe_id} (key {existing.idempotency_key}); "
            f"refusing to record it again as {stripe_id} (key {idempotency_key})"
        )


# ---------------------------------------------------------------- in memory


class InMemorySyncState:
    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], StripeRecord] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, local_id: str) -> StripeRecord | None:
        _check_kind(kind)
        return self._rows.get((kind, local_id))

    def record(self, kind: str, local_id: str, stripe_id: str, idempotency_key: str) -> None:
        _check_kind(kind)
        with self._lock:
            existing = self._rows.get((kind, local_id))
            if existing is not None:
                _same(existing, stripe_id, idempotency_key)
                return
            self._rows[(kind, local_id)] = StripeRecord(kind, local_id, stripe_id, idempotency_key)

    def records(self, kind: str | None = None) -> list[StripeRecord]:
        return [r for r in self._rows.values() if kind is None or r.kind == kind]


class InMemoryWebhookEventLog:
    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def claim(self, event_id: str, type: str, payload: dict[str, Any], received_at: datetime) -> Iterator[bool]:
        with self._lock:  # one event at a time: a concurrent duplicate waits, then sees it recorded
            if event_id in self.events:
                yield False
                return
            yield True
            self.events[event_id] = {"type": type, "payload": payload, "received_at": received_at}


# ---------------------------------------------------------------- PostgreSQL


class PostgresSyncState:
    """`stripe_objects` rows; each record is its own committed transaction (it must outlive a crash
    right after it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, kind: str, local_id: str) -> StripeRecord | None:
        _check_kind(kind)
        t = stripe_objects
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.c.stripe_id, t.c.idempotency_key).where(t.c.kind == kind, t.c.local_id == local_id)
            ).first()
        return None if row is None else StripeRecord(kind, local_id, row.stripe_id, row.idempotency_key)

    def record(self, kind: str, local_id: str, stripe_id: str, idempotency_key: str) -> None:
        _check_kind(kind)
        t = stripe_objects
        with self.engine.begin() as conn:
            inserted = conn.execute(
                insert(t)
                .values(kind=kind, local_id=local_id, stripe_id=stripe_id, idempotency_key=idempotency_key)
                .on_conflict_do_nothing(index_elements=[t.c.kind, t.c.local_id])
                .returning(t.c.stripe_id)
            ).first()
            if inserted is None:
                row = conn.execute(
                    select(t.c.stripe_id, t.c.idempotency_key).where(t.c.kind == kind, t.c.local_id == local_id)
                ).one()
                _same(StripeRecord(kind, local_id, row.stripe_id, row.idempotency_key), stripe_id, idempotency_key)


class PostgresWebhookEventLog:
    """`stripe_webhook_events`: the insert and the caller's work share one transaction, committed when
    the `claim` block exits; a concurrent delivery of the same event waits on the primary key and
    then finds it (ON CONFLICT DO NOTHING)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextlib.contextmanager
    def claim(self, event_id: str, type: str, payload: dict[str, Any], received_at: datetime) -> Iterator[bool]:
        t = stripe_webhook_events
        with self.engine.begin() as conn:
            inserted = conn.execute(
                insert(t)
                .values(event_id=event_id, type=type, payload=payload, received_at=received_at.astimezone(UTC))
                .on_conflict_do_nothing(index_elements=[t.c.event_id])
                .returning(t.c.event_id)
            ).first()
            yield inserted is not None

    def seen(self, event_id: str) -> bool:
        t = stripe_webhook_events
        with self.engine.connect() as conn:
            return conn.execute(select(t.c.event_id).where(t.c.event_id == event_id)).first() is not None
