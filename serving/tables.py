"""The serving tier's tables (SQLAlchemy Core): API keys, budgets, reservations, rate windows.

Alembic revision 0002 (migrations/versions/0002_serving_control.py) creates exactly these.

- `api_keys`: one row per customer API key. Only the SHA-256 of the secret is stored.
- `customer_budgets`: per customer the monthly spend cap (NULL = none), its mode
  (`hard` rejects, `soft` warns), and the RPM / TPM limits (NULL = none). The row is also the
  per-customer lock every admission takes (`SELECT ... FOR UPDATE`), so that gateways on
  several processes or machines admit one request at a time per limited customer.
- `budget_reservations`: one row per admitted request of a limited customer, keyed by the
  gateway's request id. `state = 'reserved'` holds the request's worst-case cost until it
  finishes (or `expires_at` passes: a gateway that died mid-request frees its reservation);
  `state = 'settled'` holds the actual cost until metering has ingested the request's event
  (`event_source`, `event_id` found in metering's `event_keys`), after which the rollups count it.
- `rate_windows`: per customer and minute, the requests admitted and tokens charged
  (worst case at admission, corrected to actual tokens at settlement).
- `customer_residency` (revision 0010): the regions a customer's requests may be served in
  (serving/residency.py); no row = no restriction.
- `capacity_arrivals_minutely` (revision 0022): per deployment, UTC minute and gateway process
  (`gateway_instance`, random per process), the requests that gateway admitted and their predicted
  p50 output tokens: the capacity signal's demand at arrival, summed over gateways by every reader
  (serving/capacity_arrivals_store.py). Each gateway writes its own rows with their full counts;
  rows older than the signal needs (90 minutes) are deleted by the gateways' flushes.
"""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
)

from infermeter.db import Quantity, metadata, timestamp_column

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("customer_id", Text, nullable=False),
    Column("project_id", Text, nullable=True),
    Column("secret_sha256", LargeBinary, nullable=False),
    Column("display_prefix", Text, nullable=False),
    timestamp_column("created_at", nullable=False, server_default=func.now()),
    timestamp_column("revoked_at", nullable=True),
)
Index("api_keys_customer", api_keys.c.customer_id)

customer_budgets = Table(
    "customer_budgets",
    metadata,
    Column("customer_id", Text, primary_key=True),
    Column("monthly_cap", Quantity, nullable=True),
    Column("mode", Text, nullable=False, server_default="hard"),
    Column("rpm", Integer, nullable=True),
    Column("tpm", BigInteger, nullable=True),
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
)

budget_reservations = Table(
    "budget_reservations",
    metadata,
    Column("request_id", Text, primary_key=True),
    Column("customer_id", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("amount", Quantity, nullable=False),
    Column("worst_case", Quantity, nullable=False),
    Column("worst_tokens", BigInteger, nullable=False),
    timestamp_column("window_start", nullable=False),
    Column("event_source", Text, nullable=True),
    Column("event_id", Text, nullable=True),
    timestamp_column("created_at", nullable=False),
    timestamp_column("expires_at", nullable=False),
    timestamp_column("settled_at", nullable=True),
)
Index("budget_reservations_customer", budget_reservations.c.customer_id, budget_reservations.c.state)

rate_windows = Table(
    "rate_windows",
    metadata,
    Column("customer_id", Text, nullable=False),
    timestamp_column("window_start", nullable=False),
    Column("requests", BigInteger, nullable=False, server_default="0"),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    PrimaryKeyConstraint("customer_id", "window_start", name="rate_windows_pkey"),
)

customer_residency = Table(
    "customer_residency",
    metadata,
    Column("customer_id", Text, primary_key=True),
    Column("regions", ARRAY(Text), nullable=False),  # sorted, non-empty, each one of INFERMETER_REGIONS
    timestamp_column("updated_at", nullable=False, server_default=func.now()),
)

capacity_arrivals_minutely = Table(
    "capacity_arrivals_minutely",
    metadata,
    Column("deployment_id", Text, nullable=False),
    timestamp_column("minute", nullable=False),
    Column("gateway_instance", Text, nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("predicted_output_tokens", BigInteger, nullable=False),
    PrimaryKeyConstraint("deployment_id", "minute", "gateway_instance", name="capacity_arrivals_minutely_pkey"),
)

__all__ = ["api_keys", "customer_budgets", "budget_reservations", "rate_windows", "customer_residency",
           "capacity_arrivals_minutely"]
