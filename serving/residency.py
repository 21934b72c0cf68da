"""Data residency: the regions a customer's requests may be served in, and routing inside them.

Replicas carry a `region` (the upstreams file, serving/upstreams.py; the replica agent's
`--region`), one of INFERMETER_REGIONS. A customer may be restricted to some regions:

    set_residency(engine, customer_id, ["eu-west", "eu-central"], known=...)  # ResidencyError if unknown
    clear_residency(engine, customer_id) -> bool      # False: it had no restriction
    get_residency(engine, customer_id) -> tuple | None
    all_residencies(engine) -> dict[customer_id, tuple]

(`infermeter customers residency C --regions eu-west,eu-central | --clear`, and
`GET|PUT /v1/customers/{id}/residency` on the API app, both in serving/residency_api.py.) No row: no
restriction.

The gateway (serving/proxy.py) never sends a restricted customer's request to a replica outside its
regions, on the first try, on failover and on the fallback models alike:

- `ResidencyCache.excluded(customer_id, route)`: the replica ids of the requested model's chain
  (the model and its fallbacks) outside the customer's regions, or None when nothing is excluded
  (unrestricted, or every replica of the chain is in its regions: routing is then unchanged). The
  customer's regions are cached for INFERMETER_KEY_CACHE_TTL_S, primed by the API-key lookup
  (serving/keys.py reads the regions in the same statement) so a request with a cached key reads
  no database; the excluded set is computed once per (model, regions).
- `pick_allowed`: prefix-aware (or round-robin) routing among the allowed replicas whose breaker
  is not open, the model first, then its fallbacks. None when no allowed replica is healthy: the
  request is not sent anywhere and the client gets 503 `residency_unavailable`; its one event says
  `rejected` with tag `reason: residency` (cost anatomy counts it under cause `routing`). Unlike an
  unrestricted request, a restricted one is never sent to an open replica as a last resort: it
  waits for the breaker's half-open probe like every other request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from serving.openai_api import ApiError
from serving.routing import pick_replica
from serving.single_flight import SingleFlight
from serving.tables import customer_residency
from serving.upstreams import ModelRoute, Replica, parse_regions, unknown_regions_error

RESIDENCY_REASON = "residency"  # the rejected event's tags.reason
_MAX_CACHED = 100_000


class ResidencyError(ValueError):
    """A residency request that cannot be stored (unknown region, none given): nothing was written."""


# --- the store (CLI, admin API) ----------------------------------------------------------------


def checked_regions(regions: str | Iterable[str], known: Iterable[str]) -> tuple[str, ...]:
    """The regions, de-duplicated and sorted; ResidencyError unless each is one of `known`."""
    try:
        parsed = parse_regions(regions, what="regions")
    except ValueError as exc:
        raise ResidencyError(str(exc)) from None
    if not parsed:
        raise ResidencyError("regions: name at least one region (or clear the restriction)")
    if problem := unknown_regions_error(parsed, tuple(known), what="regions"):
        raise ResidencyError(problem)
    return parsed


def set_residency(
    engine: Engine, customer_id: str, regions: str | Iterable[str], *, known: Iterable[str]
) -> tuple[str, ...]:
    """Restrict the customer to `regions` (replacing any earlier restriction); checked first."""
    if not customer_id:
        raise ResidencyError("customer id must not be empty")
    allowed = checked_regions(regions, known)
    statement = insert(customer_residency).values(customer_id=customer_id, regions=list(allowed))
    with engine.begin() as conn:
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=[customer_residency.c.customer_id],
                set_={"regions": statement.excluded.regions, "updated_at": datetime.now(UTC)},
            )
        )
    return allowed


def clear_residency(engine: Engine, customer_id: str) -> bool:
    """Lift the customer's restriction; False when it had none."""
    with engine.begin() as conn:
        result = conn.execute(delete(customer_residency).where(customer_residency.c.customer_id == customer_id))
    return result.rowcount == 1


def get_residency(engine: Engine, customer_id: str) -> tuple[str, ...] | None:
    with engine.connect() as conn:
        row = conn.execute(
            select(customer_residency.c.regions).where(customer_residency.c.customer_id == customer_id)
        ).first()
    return tuple(row[0]) if row else None


def all_residencies(engine: Engine) -> dict[str, tuple[str, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(customer_residency.c.customer_id, customer_residency.c.regions).order_by(
                customer_residency.c.customer_id
            )
        ).all()
    return {customer_id: tuple(regions) for customer_id, regions in rows}


# --- the gateway -------------------------------------------------------------------------------


class ResidencyCache:
    """Each customer's regions (None: unrestricted), cached for `ttl_s` seconds per gateway process."""

    def __init__(self, engine: Engine | None, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self._clock = clock
        self._regions: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._excluded: dict[tuple[str, frozenset[str]], frozenset[str] | None] = {}
        self._lock = threading.Lock()
        self._flights = SingleFlight("customer regions")  # one read per customer at a time

    def prime(self, customer_id: str, regions: Iterable[str] | None) -> None:
        """Remember a customer's regions read elsewhere (the API-key lookup)."""
        if self.ttl_s <= 0:
            return
        value = None if regions is None else frozenset(regions)
        with self._lock:
            if len(self._regions) >= _MAX_CACHED:
                self._regions.clear()
            self._regions[customer_id] = (self._clock() + self.ttl_s, value)

    def _load(self, customer_id: str) -> frozenset[str] | None:
        regions = get_residency(self.engine, customer_id) if self.engine is not None else None
        self.prime(customer_id, regions)
        return None if regions is None else frozenset(regions)

    def cached(self, customer_id: str) -> frozenset[str] | None:
        """The regions last read for the customer, however old (error messages)."""
        entry = self._regions.get(customer_id)
        return entry[1] if entry is not None else None

    async def regions(self, customer_id: str) -> frozenset[str] | None:
        entry = self._regions.get(customer_id)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        return await self._flights.run(customer_id, self._load, customer_id)

    async def excluded(self, customer_id: str, route: ModelRoute) -> frozenset[str] | None:
        """Replica ids of `route`'s chain outside the customer's regions; None: nothing excluded."""
        regions = await self.regions(customer_id)
        if regions is None:
            return None
        key = (route.name, regions)
        try:
            return self._excluded[key]
        except KeyError:
            pass
        outside = frozenset(
            replica.replica_id
            for model in route.chain()
            for replica in model.replicas
            if replica.region not in regions
        )
        self._excluded[key] = found = outside or None
        return found


def pick_allowed(
    route: ModelRoute, body: dict, excluded: frozenset[str], tried: set[str] | None = None
) -> tuple[ModelRoute, Replica] | None:
    """(model, replica) among the chain's replicas that are neither `excluded` nor `tried` and whose
    breaker is not open (closed, or half-open: the probe), by the model's routing policy; the model
    first, then its fallbacks. None when there is none (the request is rejected, not sent)."""
    skip = excluded if not tried else excluded | tried
    for candidate in route.chain():
        replica = pick_replica(candidate, body, exclude=skip, healthy_only=True)
        if replica is not None:
            return candidate, replica
    return None


def rejection(model: str, customer_id: str, regions: Iterable[str] | None) -> ApiError:
    """503 for a request no replica in the customer's regions can serve now (OpenAI's error shape)."""
    where = ", ".join(sorted(regions or ())) or "none"
    return ApiError(
        503,
        f"no replica of model '{model}' in the regions customer {customer_id} is restricted to ({where}) can "
        "serve this request now; by its data-residency setting it is not sent to another region",
        type_="api_error",
        code="residency_unavailable",
    )


__all__ = [
    "RESIDENCY_REASON",
    "ResidencyCache",
    "ResidencyError",
    "all_residencies",
    "checked_regions",
    "clear_residency",
    "get_residency",
    "pick_allowed",
    "rejection",
    "set_residency",
]
