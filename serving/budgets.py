"""Budgets: per-customer spend caps per billing period (hard, soft or predictive) and the admission the gateway asks for.

Public API (the gateway codes against this):

    controller = AdmissionController(engine, settings=None, clock=None)
    result = await controller.admit(
        customer_id, model=..., request_id=..., prompt_tokens=N, max_tokens=M,
        predicted_output_tokens=P99 | None)   # the gateway's prediction at admission
    # -> Admitted (forward the request; add `result.headers` to the response)
    #    or Rejected (answer result.status with result.openai_error(); add result.headers)
    await controller.settle(
        request_id, input_tokens=..., cached_input_tokens=..., output_tokens=...,
        event_source=..., event_id=...)       # after the request ends, whatever its outcome
    controller.admit_sync(...), controller.settle_sync(...)   # the same, blocking (tests, CLI)

    set_budget(engine, customer_id, monthly_cap=Decimal|None, mode="hard"|"soft"|"predictive", rpm=None, tpm=None)
    get_budget(engine, customer_id) -> BudgetConfig | None
    controller.spend(customer_id) -> Spend   # metered + settled-unmetered + reserved, this billing period
    controller.period_of(customer_id, now) -> Window   # the customer's billing period containing `now`
    list_price(model, settings) -> ListPrice # the per-token price of one request (reservations, settlement)
    metered_cost(customer_id, window, sums, settings) -> Decimal  # metered usage, priced as the invoice does

Names say "monthly" (`monthly_cap`, `--monthly-cap`, the warning's text) for compatibility; a cap is
per billing period: the customer's own, one local calendar month from its anchor day in its time zone.
A refusal (402) names the instant the next period starts.

Types (serving/gateway_contracts.py, shared with the gateway): `Admitted(request_id, customer_id,
reserved, warning, headers, limited)`; `Rejected(reason, message, status, error_type, code, headers)`
with reason one of
`budget_exceeded` (status 402, type `insufficient_quota`: a budget is not a transient
condition and 429 would make the OpenAI client retry it automatically),
`rate_limit_requests` / `rate_limit_tokens` (status 429, type `rate_limit_exceeded`, with a
`Retry-After` header). `Rejected.openai_error()` is the OpenAI error JSON body.

Soft mode: the request is admitted (and reserved) and the response carries the header
`X-Infermeter-Budget-Warning: monthly budget exceeded: spent 101.23 of 100.00` (WARNING_HEADER).

Spend, this billing period: the customer's period containing the instant, cut as billing cuts it (its
IANA time zone and anchor day: [anchor day 00:00 local, the next month's anchor day 00:00 local), e.g.
Asia/Kolkata's December from 2026-11-30T18:30Z; America/New_York's November 30 days and one hour long
across the DST change), read from the calendar billing hands metering (metering.budget_reads.
billing_period_of). A customer without a calendar counts by UTC calendar month, as metering keeps it.
  metered  = the customer's metered tokens of the period (metering.budget_reads.period_tokens, from the
             period totals metering keeps at ingest: uncached input, cached input, output per model
             and deployment; every status, as metering counts them; exact to the event when a period
             starts inside an hour), priced by `metered_cost`
+ settled  = actual costs of finished requests admitted in the period whose event metering has not
             recorded yet (budget_reservations.state='settled' and (event_source, event_id) not recorded)
+ reserved = worst cases of requests in flight (state='reserved', not expired).
The controller keeps each customer's period until it ends (an instant at or after its end reads the
next one: the boundary instant belongs to the new period). Metering's statement locates the instant
again in the same snapshot as the tokens; when it finds another period (billing changed the customer's
time zone or anchor day, and metering re-cut its totals), spend is read again under that one.
Budgets read their own table in one statement and metering's in another (metering owns its tables;
budgets call metering.budget_reads). No cost is counted twice nor missed, because metering's statement
answers both "the period's tokens" and "which of these settled requests' events are recorded" from
ONE snapshot, and metering commits an event's key and its share of the period totals in one statement
of one transaction: a settled row read by the first statement is, in the second, either recorded and
inside the tokens (so counted as metered only) or neither (so counted as settled only). A request settled between the
two statements was read as reserved: counted at its worst case (never less than its cost), as a
single snapshot would also have it when metering ingests the event before the gateway settles.
Settled rows are deleted once metered (housekeeping).

How spend is priced. Metered usage is priced as the invoice prices it: with
INFERMETER_LIST_PRICE_BOOK set, the period's tokens are one `pricing.usage.Usage` rated by
`pricing.rating.rate` (the invoice path): each charge's `free` allowance per period and line, its
tiers, and one half-up rounding per line, so budgets and invoices agree to the cent. A meter the
book has no charge for is priced at INFERMETER_LIST_PRICE_*_PER_MTOK (exact, unrounded), as is
everything when no book is set. A single request (its reservation and, until metering records it,
its settled cost) is priced by `list_price`: the book's unit price per token with no free
allowance left (an upper bound: the allowance belongs to the period's line, and the metered part
applies it once metering has the request), else the INFERMETER_LIST_PRICE_* setting.

Worst case of a request = prompt_tokens at the uncached-input list price + max_tokens at the
output list price (the gateway passes the model's context length when the client set no
max_tokens). The cost is Decimal, never float.

Concurrency: every admission of a limited customer runs in one transaction that first locks
the customer's `customer_budgets` row (SELECT ... FOR UPDATE), then computes spend, checks
cap and rate windows, and inserts the reservation. Admissions of one customer are therefore
serialised across all gateway processes: in hard mode spend never passes the cap by more than
the difference between a request's worst case and ... nothing: a request is admitted only if
spend + its worst case <= cap, so the overshoot is 0 (well inside the required "one worst
case"). LiteLLM's races (#34732 check-then-increment without a lock; #36926 spend updated only
after the response) are exactly what the lock + reservation-before-forwarding avoid.

Predictive mode (`mode="predictive"`): admission and settlement as in hard mode (a request is refused
with 402 when spend + its reservation > cap), but a request's reservation counts its predicted p99
output tokens (`predicted_output_tokens`, the gateway's prediction at admission from the newest
stored fit, serving/predictions.py), capped at max_tokens, instead of max_tokens; without a
prediction (no fit yet) it reserves max_tokens, exactly as hard mode (`reservation_output_tokens`).
More requests fit under the cap at its edge; the price is a bounded overshoot. The bound: every
admission checks, under the customer's lock, settled actuals + in-flight reservations + its own
reservation <= cap. A request's actual cost exceeds its reservation only by its output beyond the
reserved tokens (its input is reserved at the prompt's upper bound, uncached), at most
(max_tokens - reserved output tokens) x output list price. Overshoots of requests that settled
before an admission are inside the spend that admission read; so after the last admission the
spend exceeds the cap by at most the sum, over the requests in flight at that admission (itself
included), of (actual - reserved) cost:

    overshoot <= sum over in-flight requests of (max_tokens_i - reserved_output_i) x output price
              <= C x (max_tokens - p99) x output price     (C = requests in flight at once)

0 for requests that end within their p99; for a customer whose requests all run at once
it is reached only when every in-flight request runs to max_tokens
(tests/serving/test_predictive_budgets.py replays 100 concurrent requests at the edge against
PostgreSQL and checks it). Hard mode is unchanged: its reservation is always the worst case.

Customers without a budget row are admitted without touching the database (cached for
INFERMETER_BUDGET_CONFIG_TTL_S; a customer in use is checked again in the background shortly before
that expires, serving/single_flight.py, so its requests do not wait for the check; after an idle
spell past the entry's lifetime, the requests that find it expired share that one check). On the
gateway the API key's lookup reads the same row in its statement and primes the entry (`prime`,
serving/keys.py), so a request after an idle spell waits for that one lookup.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from infermeter.settings import Settings, get_settings
from infermeter.times import Window, utc_text
from metering.budget_reads import billing_period_of, period_tokens
from metering.event_lookups import recorded_event_keys
from serving import ratelimit
from serving.budget_prices import list_price, metered_cost
from serving.gateway_contracts import Admitted, Rejected
from serving.single_flight import SingleFlight, due
from serving.tables import budget_reservations, customer_budgets

WARNING_HEADER = "X-Infermeter-Budget-Warning"
MODES = ("hard", "soft", "predictive")
_ZERO = Decimal(0)

def reservation_output_tokens(mode: str, max_tokens: int, predicted_output_tokens: int | None) -> int:
    """The output tokens a request's reservation counts: `max_tokens` (its worst case), except in
    `predictive` mode with a prediction: the predicted p99, at most `max_tokens`."""
    if mode != "predictive" or predicted_output_tokens is None:
        return max_tokens
    return min(max(predicted_output_tokens, 0), max_tokens)


# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetConfig:
    customer_id: str
    monthly_cap: Decimal | None
    mode: str
    rpm: int | None
    tpm: int | None


def set_budget(
    engine: Engine,
    customer_id: str,
    *,
    monthly_cap: Decimal | None = None,
    mode: str = "hard",
    rpm: int | None = None,
    tpm: int | None = None,
) -> BudgetConfig:
    """Create or replace the customer's budget and rate limits (None = no limit of that kind)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if monthly_cap is not None:
        monthly_cap = Decimal(monthly_cap)
        if monthly_cap < 0:
            raise ValueError("monthly_cap must not be negative")
    for name, value in (("rpm", rpm), ("tpm", tpm)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must not be negative")
    values = dict(customer_id=customer_id, monthly_cap=monthly_cap, mode=mode, rpm=rpm, tpm=tpm)
    statement = insert(customer_budgets).values(**values)
    with engine.begin() as conn:
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=[customer_budgets.c.customer_id],
                set_={**{k: statement.excluded[k] for k in ("monthly_cap", "mode", "rpm", "tpm")},
                      "updated_at": text("now()")},
            )
        )
    return BudgetConfig(customer_id, monthly_cap, mode, rpm, tpm)


def get_budget(engine: Engine, customer_id: str) -> BudgetConfig | None:
    with engine.connect() as conn:
        row = conn.execute(select(customer_budgets).where(customer_budgets.c.customer_id == customer_id)).first()
    return _config(row) if row else None


def list_budgets(engine: Engine) -> list[BudgetConfig]:
    with engine.connect() as conn:
        rows = conn.execute(select(customer_budgets).order_by(customer_budgets.c.customer_id)).all()
    return [_config(r) for r in rows]


def clear_budget(engine: Engine, customer_id: str) -> bool:
    with engine.begin() as conn:
        return conn.execute(customer_budgets.delete().where(customer_budgets.c.customer_id == customer_id)).rowcount == 1


def _config(row) -> BudgetConfig:
    return BudgetConfig(
        row.customer_id,
        None if row.monthly_cap is None else Decimal(row.monthly_cap),
        row.mode,
        row.rpm,
        row.tpm,
    )


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spend:
    metered: Decimal
    settled_unmetered: Decimal
    reserved: Decimal
    period: Window | None = None  # the customer's billing period this spend is of

    @property
    def total(self) -> Decimal:
        return self.metered + self.settled_unmetered + self.reserved


def _money(amount: Decimal) -> str:
    return f"{amount.quantize(Decimal('0.01')):f}"


# --- the controller ----------------------------------------------------------------------------

# Budgets' own part of spend, one statement (one snapshot of budget_reservations): each settled
# row of the customer's billing period (its cost and its event's key, looked up in metering next) and the reserved sum.
_RESERVATIONS_SQL = text(
    """
    SELECT 'settled' AS part, amount, event_source, event_id
      FROM budget_reservations
     WHERE customer_id = :customer_id AND state = 'settled'
       AND created_at >= :period_start AND created_at < :period_end
    UNION ALL
    SELECT 'reserved', coalesce(sum(amount), 0), NULL, NULL
      FROM budget_reservations
     WHERE customer_id = :customer_id AND state = 'reserved' AND expires_at > :now
    """
)

# Reservations are short-lived soft state: their commits need not wait for the WAL flush. A
# database crash could forget the last few milliseconds of reservations (and never corrupts
# anything); it saves a disk flush on every admission and settlement.
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")

_LOCK_SQL = text(
    """
    SELECT customer_id, monthly_cap, mode, rpm, tpm, set_config('synchronous_commit', 'off', true) AS async_commit
      FROM customer_budgets WHERE customer_id = :customer_id FOR UPDATE
    """
)

_RESERVE_SQL = text(
    """
    WITH charged AS (
        INSERT INTO rate_windows (customer_id, window_start, requests, tokens)
        VALUES (:customer_id, :window_start, 1, :worst_tokens)
        ON CONFLICT (customer_id, window_start)
        DO UPDATE SET requests = rate_windows.requests + 1, tokens = rate_windows.tokens + EXCLUDED.tokens
        RETURNING 1
    )
    INSERT INTO budget_reservations (request_id, customer_id, state, model, amount, worst_case, worst_tokens,
                                     window_start, created_at, expires_at)
    SELECT :request_id, :customer_id, 'reserved', :model, :worst, :worst, :worst_tokens, :window_start, :now, :expires_at
      FROM charged
    """
)

_SETTLED_KEYS_SQL = text(
    """
    SELECT request_id, event_source, event_id FROM budget_reservations
     WHERE customer_id = :customer_id AND state = 'settled' AND event_source IS NOT NULL AND event_id IS NOT NULL
    """
)

_HOUSEKEEP_SQL = text(
    """
    DELETE FROM budget_reservations r
     WHERE r.customer_id = :customer_id
       AND ((r.state = 'reserved' AND r.expires_at <= :now)
            OR (r.state = 'settled' AND (r.created_at < :period_start OR r.request_id = ANY(CAST(:metered AS text[])))))
    """
)


def _driver_connection(conn):
    """The psycopg connection under a SQLAlchemy connection, in its transaction (metering.budget_reads'
    read functions take psycopg connections)."""
    return conn.connection.driver_connection


class AdmissionController:
    def __init__(
        self,
        engine: Engine,
        settings: Settings | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        executor: ThreadPoolExecutor | None = None,
        housekeep_every_s: float = 30.0,
    ) -> None:
        self.engine = engine
        self.settings = settings or get_settings()
        self._clock = clock or (lambda: datetime.now(UTC))
        self._executor = executor or ThreadPoolExecutor(max_workers=8, thread_name_prefix="admission")
        self._unlimited: dict[str, float] = {}  # customer -> until when it is known to have no budget row
        self._flights = SingleFlight("customers without limits")
        self._lock = threading.Lock()
        self._housekeep_every_s = housekeep_every_s
        self._housekept: dict[str, float] = {}
        self._periods: dict[str, Window] = {}  # customer -> its billing period last read (kept until it ends)

    # --- async faces for the gateway -----------------------------------------------------------

    async def admit(self, customer_id: str, **kwargs) -> Admitted | Rejected:
        expires = self._unlimited.get(customer_id)
        if expires is not None:
            now = time.monotonic()
            if now >= expires:
                # Known to have no limits until its entry expired (the customer was idle through the
                # background check's window): every request that finds it so waits for the one check
                # (serving/single_flight.py), not for an admission transaction of its own each.
                await self._flights.run(customer_id, self._check_unlimited, customer_id)
                expires = self._unlimited.get(customer_id)
                now = time.monotonic()
            if expires is not None and now < expires:
                if due(expires, self.settings.budget_config_ttl_s, now):
                    self._flights.refresh(customer_id, self._check_unlimited, customer_id)
                return Admitted(kwargs["request_id"], customer_id)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self.admit_sync, customer_id, **kwargs))

    async def settle(self, request_id: str, **kwargs) -> Decimal | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self.settle_sync, request_id, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # --- the rules -----------------------------------------------------------------------------

    def prime(self, customer_id: str, *, has_budget: bool) -> None:
        """What another read found of the customer's budget row (the API key's lookup, serving/keys.py,
        reads it in the same statement): the same as `_check_unlimited` finding it."""
        with self._lock:
            if has_budget:
                self._unlimited.pop(customer_id, None)
            else:
                self._unlimited[customer_id] = time.monotonic() + self.settings.budget_config_ttl_s

    def _known_unlimited(self, customer_id: str) -> bool:
        expires = self._unlimited.get(customer_id)
        return expires is not None and expires > time.monotonic()

    def _check_unlimited(self, customer_id: str) -> None:
        """Read again whether the customer still has no budget row (the background refresh of `admit`)."""
        with self.engine.connect() as conn:
            limited = conn.execute(
                select(customer_budgets.c.customer_id).where(customer_budgets.c.customer_id == customer_id)
            ).first() is not None
        self.prime(customer_id, has_budget=limited)

    def period_of(self, customer_id: str, now: datetime, conn=None) -> Window:
        """The customer's billing period containing `now` (metering.budget_reads.billing_period_of: its
        time zone and anchor day, the UTC calendar month without a calendar). Kept per customer until
        the period ends; `spend` replaces it when metering, in the same snapshot as the tokens, locates
        `now` in another period (the customer's calendar changed)."""
        with self._lock:
            period = self._periods.get(customer_id)
        if period is not None and now in period:
            return period
        if conn is None:
            with self.engine.connect() as own:
                return self.period_of(customer_id, now, own)
        period = billing_period_of(_driver_connection(conn), customer_id, now)
        with self._lock:
            self._periods[customer_id] = period
        return period

    def spend(self, customer_id: str, *, now: datetime | None = None, conn=None) -> Spend:
        """Spend of the customer's billing period containing `now` (default: the clock's now)."""
        now = now or self._clock()
        if conn is None:
            with self.engine.connect() as own:
                return self.spend(customer_id, now=now, conn=own)
        period = self.period_of(customer_id, now, conn)
        # 1. budgets' own rows, one snapshot: the period's settled costs and the reserved worst cases
        rows = conn.execute(
            _RESERVATIONS_SQL,
            dict(customer_id=customer_id, period_start=period.start, period_end=period.end, now=now),
        ).all()
        reserved = sum((Decimal(r.amount) for r in rows if r.part == "reserved"), _ZERO)
        settled_rows = [r for r in rows if r.part == "settled"]
        # 2. metering's rows, one snapshot, in the same transaction: the period, its tokens and which
        # of the settled requests' events are already in them (see the module docstring)
        metered = period_tokens(
            _driver_connection(conn), customer_id, now,
            recorded_of=[(r.event_source, r.event_id) for r in settled_rows
                         if r.event_source is not None and r.event_id is not None],
        )
        if metered.period != period:  # the calendar changed since the period was read: read again
            with self._lock:
                self._periods[customer_id] = metered.period
            return self.spend(customer_id, now=now, conn=conn)
        settled = sum(
            (Decimal(r.amount) for r in settled_rows if (r.event_source, r.event_id) not in metered.recorded), _ZERO
        )
        return Spend(metered_cost(customer_id, period, metered.sums, self.settings), settled, reserved, period)

    def admit_sync(
        self,
        customer_id: str,
        *,
        model: str,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        predicted_output_tokens: int | None = None,
        now: datetime | None = None,
    ) -> Admitted | Rejected:
        """Admit or reject one request; an admitted request of a limited customer holds a reservation:
        its worst case, or in `predictive` mode its predicted cost (`reservation_output_tokens`)."""
        if self._known_unlimited(customer_id):
            return Admitted(request_id, customer_id)
        now = now or self._clock()
        price = list_price(model, self.settings)
        worst_tokens = prompt_tokens + max_tokens
        start = ratelimit.window_start(now)
        with self.engine.begin() as conn:
            # 1. Lock the customer's row (and make this transaction's commit asynchronous).
            # Rate windows and spend are read by LATER statements on purpose: under READ
            # COMMITTED a statement that waited for a row lock re-checks only the locked row,
            # while everything else it reads keeps the snapshot taken before the wait, which
            # would miss what the previous lock holder just committed.
            row = conn.execute(_LOCK_SQL, {"customer_id": customer_id}).first()
            if row is None:
                with self._lock:
                    self._unlimited[customer_id] = time.monotonic() + self.settings.budget_config_ttl_s
                return Admitted(request_id, customer_id)
            config = _config(row)
            output_tokens = reservation_output_tokens(config.mode, max_tokens, predicted_output_tokens)
            worst = price.cost(uncached_input_tokens=prompt_tokens, cached_input_tokens=0, output_tokens=output_tokens)
            if config.rpm is not None or config.tpm is not None:
                previous, current = ratelimit.load(conn, customer_id, now)
                decision = ratelimit.check(config.rpm, config.tpm, previous, current, now, worst_tokens)
                if not decision.allowed:
                    return Rejected(
                        reason=decision.reason,  # type: ignore[arg-type]
                        message=decision.message,
                        status=429,
                        error_type="rate_limit_exceeded",
                        code="rate_limit_exceeded",
                        headers={"Retry-After": str(decision.retry_after_s)},
                    )
            warning = None
            if config.monthly_cap is not None:
                spend = self.spend(customer_id, now=now, conn=conn)
                if spend.total + worst > config.monthly_cap:
                    text_ = (
                        f"monthly budget exceeded: spent {_money(spend.total)} of {_money(config.monthly_cap)}"
                        f" (this request may cost up to {_money(worst)})"
                    )
                    if config.mode != "soft":
                        return Rejected(
                            reason="budget_exceeded",
                            message=f"Your {text_}. Raise the budget or wait for the next billing period,"
                                    f" which starts at {utc_text(spend.period.end)}.",
                            status=402,
                            error_type="insufficient_quota",
                            code="budget_exceeded",
                        )
                    warning = text_
            conn.execute(  # 2. charge the rate window and reserve, in one statement
                _RESERVE_SQL,
                dict(
                    request_id=request_id,
                    customer_id=customer_id,
                    model=model,
                    worst=worst,
                    worst_tokens=worst_tokens,
                    window_start=start,
                    now=now,
                    expires_at=now + timedelta(seconds=self.settings.reservation_ttl_s),
                ),
            )
        self._maybe_housekeep(customer_id, now)
        headers = {WARNING_HEADER: warning} if warning else {}
        return Admitted(request_id, customer_id, worst, warning, headers, limited=True)

    def settle_sync(
        self,
        request_id: str,
        *,
        input_tokens: int,
        cached_input_tokens: int,
        output_tokens: int,
        event_source: str | None,
        event_id: str | None,
        now: datetime | None = None,
    ) -> Decimal | None:
        """Replace the reservation by the actual cost (kept until metering has the request's event).

        Returns the actual cost, or None when there was no reservation (customer without limits,
        or already settled). Call it once per admitted request, whatever its outcome."""
        now = now or self._clock()
        with self.engine.begin() as conn:
            conn.execute(_ASYNC_COMMIT)
            row = conn.execute(
                select(budget_reservations)
                .where(budget_reservations.c.request_id == request_id, budget_reservations.c.state == "reserved")
                .with_for_update()
            ).first()
            if row is None:
                return None
            actual = list_price(row.model, self.settings).cost(
                uncached_input_tokens=max(input_tokens - cached_input_tokens, 0),
                cached_input_tokens=cached_input_tokens,
                output_tokens=output_tokens,
            )
            if actual == 0:
                conn.execute(budget_reservations.delete().where(budget_reservations.c.request_id == request_id))
            else:
                conn.execute(
                    update(budget_reservations)
                    .where(budget_reservations.c.request_id == request_id)
                    .values(state="settled", amount=actual, event_source=event_source, event_id=event_id, settled_at=now)
                )
            ratelimit.adjust_tokens(
                conn, row.customer_id, row.window_start, (input_tokens + output_tokens) - int(row.worst_tokens)
            )
        return actual

    def housekeep(self, customer_id: str, now: datetime | None = None) -> None:
        """Delete expired reservations, settled costs metering now counts, and old rate windows."""
        now = now or self._clock()
        with self.engine.begin() as conn:
            period_start = self.period_of(customer_id, now, conn).start
            settled = conn.execute(_SETTLED_KEYS_SQL, dict(customer_id=customer_id)).all()
            recorded = recorded_event_keys(_driver_connection(conn), [(r.event_source, r.event_id) for r in settled])
            metered = [r.request_id for r in settled if (r.event_source, r.event_id) in recorded]
            conn.execute(_HOUSEKEEP_SQL, dict(customer_id=customer_id, now=now, period_start=period_start, metered=metered))
            ratelimit.forget_old_windows(conn, customer_id, now)

    def _maybe_housekeep(self, customer_id: str, now: datetime) -> None:
        last = self._housekept.get(customer_id, 0.0)
        if time.monotonic() - last >= self._housekeep_every_s:
            self._housekept[customer_id] = time.monotonic()
            self.housekeep(customer_id, now)
