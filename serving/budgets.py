"""Budgets: per-customer monthly spend caps (hard or soft) and the admission the gateway asks for.

Public API (the gateway codes against this):

    controller = AdmissionController(engine, settings=None, clock=None)
    result = await controller.admit(
        customer_id, model=..., request_id=..., prompt_tokens=N, max_tokens=M)
    # -> Admitted (forward the request; add `result.headers` to the response)
    #    or Rejected (answer result.status with result.openai_error(); add result.headers)
    await controller.settle(
        request_id, input_tokens=..., cached_input_tokens=..., output_tokens=...,
        event_source=..., event_id=...)       # after the request ends, whatever its outcome
    controller.admit_sync(...), controller.settle_sync(...)   # the same, blocking (tests, CLI)

    set_budget(engine, customer_id, monthly_cap=Decimal|None, mode="hard"|"soft", rpm=None, tpm=None)
    get_budget(engine, customer_id) -> BudgetConfig | None
    controller.spend(customer_id) -> Spend   # metered + settled-unmetered + reserved, this month
    list_price(model, settings) -> ListPrice # THE one function that prices tokens for budgets

Types (serving/gateway_contracts.py, shared with the gateway): `Admitted(request_id, customer_id,
reserved, warning, headers, limited)`; `Rejected(reason, message, status, error_type, code, headers)`
with reason one of
`budget_exceeded` (status 402, type `insufficient_quota`: a budget is not a transient
condition and 429 would make the OpenAI client retry it automatically),
`rate_limit_requests` / `rate_limit_tokens` (status 429, type `rate_limit_exceeded`, with a
`Retry-After` header). `Rejected.openai_error()` is the OpenAI error JSON body.

Soft mode: the request is admitted (and reserved) and the response carries the header
`X-Infermeter-Budget-Warning: monthly budget exceeded: spent 101.23 of 100.00` (WARNING_HEADER).

Spend, this calendar month in UTC ([first of month 00:00Z, next first)):
  metered  = request_rollup_hourly of the month, rated at list price per model
             (uncached input, cached input, output; every status, as metering counts them)
+ settled  = actual costs of finished requests whose event metering has not ingested yet
             (budget_reservations.state='settled' and (event_source, event_id) not in event_keys)
+ reserved = worst cases of requests in flight (state='reserved', not expired).
Both parts come from ONE SQL statement, so they see one snapshot: the instant metering commits
an event (rollup + event_keys in one transaction) its cost moves from `settled` to `metered`,
never counted twice nor missed. Settled rows are deleted once metered (housekeeping).

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
Customers without a budget row are admitted without touching the database (cached for
INFERMETER_BUDGET_CONFIG_TTL_S).
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
from functools import lru_cache, partial

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from infermeter.settings import Settings, get_settings
from serving import ratelimit
from serving.gateway_contracts import Admitted, Rejected
from serving.tables import budget_reservations, customer_budgets

WARNING_HEADER = "X-Infermeter-Budget-Warning"
MODES = ("hard", "soft")
_MTOK = Decimal(1_000_000)
_ZERO = Decimal(0)

# --- list price: THE one function that prices tokens for budgets -------------------------------


@dataclass(frozen=True)
class ListPrice:
    """Per-token list prices (currency units per token)."""

    uncached_input: Decimal
    cached_input: Decimal
    output: Decimal

    def cost(self, *, uncached_input_tokens: int, cached_input_tokens: int, output_tokens: int) -> Decimal:
        return (
            self.uncached_input * uncached_input_tokens
            + self.cached_input * cached_input_tokens
            + self.output * output_tokens
        )


def list_price(model: str, settings: Settings | None = None) -> ListPrice:
    """The list price of `model` used for budgets.

    From the price book INFERMETER_LIST_PRICE_BOOK when set: its `unit` price on
    uncached_input_tokens / cached_input_tokens / output_tokens that best matches the model
    (pricing.rating.match_charge). Any meter the book does not price per unit falls back to
    INFERMETER_LIST_PRICE_*_PER_MTOK (decimal strings per 1M tokens, the same for every model)."""
    settings = settings or get_settings()
    fallback = {
        "uncached_input_tokens": Decimal(settings.list_price_input_per_mtok) / _MTOK,
        "cached_input_tokens": Decimal(settings.list_price_cached_input_per_mtok) / _MTOK,
        "output_tokens": Decimal(settings.list_price_output_per_mtok) / _MTOK,
    }
    if settings.list_price_book:
        fallback.update(_book_unit_prices(str(settings.list_price_book), model))
    return ListPrice(
        uncached_input=fallback["uncached_input_tokens"],
        cached_input=fallback["cached_input_tokens"],
        output=fallback["output_tokens"],
    )


@lru_cache(maxsize=64)
def _price_book(path: str):
    from pricing.book import parse_price_book

    with open(path, encoding="utf-8") as handle:
        return parse_price_book(handle.read(), source=path)


@lru_cache(maxsize=1024)
def _book_unit_prices(path: str, model: str) -> dict[str, Decimal]:
    from pricing.book import UnitPrice
    from pricing.rating import match_charge
    from pricing.usage import UsageKey

    book = _price_book(path)
    prices = {}
    for meter in ("uncached_input_tokens", "cached_input_tokens", "output_tokens"):
        matched = match_charge(book, UsageKey(meter=meter, model=model))
        if matched is not None and isinstance(matched[1].price, UnitPrice):
            price = matched[1].price
            prices[meter] = Decimal(price.amount) / Decimal(getattr(price, "per", 1))
    return prices


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

    @property
    def total(self) -> Decimal:
        return self.metered + self.settled_unmetered + self.reserved


def month_window(now: datetime) -> tuple[datetime, datetime]:
    """[first of the month 00:00 UTC, first of the next month) containing `now`."""
    now = now.astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def _money(amount: Decimal) -> str:
    return f"{amount.quantize(Decimal('0.01')):f}"


# --- the controller ----------------------------------------------------------------------------

_SPEND_SQL = text(
    """
    SELECT 'metered' AS part, model,
           sum(input_tokens - cached_input_tokens) AS uncached, sum(cached_input_tokens) AS cached,
           sum(output_tokens) AS output, NULL::numeric AS amount
      FROM request_rollup_hourly
     WHERE customer_id = :customer_id AND hour >= :month_start AND hour < :month_end
     GROUP BY model
    UNION ALL
    SELECT 'settled', NULL, NULL, NULL, NULL, coalesce(sum(r.amount), 0)
      FROM budget_reservations r
     WHERE r.customer_id = :customer_id AND r.state = 'settled'
       AND r.created_at >= :month_start AND r.created_at < :month_end
       AND NOT EXISTS (SELECT 1 FROM event_keys k WHERE k.source = r.event_source AND k.event_id = r.event_id)
    UNION ALL
    SELECT 'reserved', NULL, NULL, NULL, NULL, coalesce(sum(amount), 0)
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

_HOUSEKEEP_SQL = text(
    """
    DELETE FROM budget_reservations r
     WHERE r.customer_id = :customer_id
       AND ((r.state = 'reserved' AND r.expires_at <= :now)
            OR (r.state = 'settled' AND (r.created_at < :month_start
                 OR EXISTS (SELECT 1 FROM event_keys k WHERE k.source = r.event_source AND k.event_id = r.event_id))))
    """
)


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
        self._unlimited: dict[str, float] = {}
        self._lock = threading.Lock()
        self._housekeep_every_s = housekeep_every_s
        self._housekept: dict[str, float] = {}

    # --- async faces for the gateway -----------------------------------------------------------

    async def admit(self, customer_id: str, **kwargs) -> Admitted | Rejected:
        if self._known_unlimited(customer_id):
            return Admitted(kwargs["request_id"], customer_id)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self.admit_sync, customer_id, **kwargs))

    async def settle(self, request_id: str, **kwargs) -> Decimal | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self.settle_sync, request_id, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # --- the rules -----------------------------------------------------------------------------

    def _known_unlimited(self, customer_id: str) -> bool:
        expires = self._unlimited.get(customer_id)
        return expires is not None and expires > time.monotonic()

    def spend(self, customer_id: str, *, now: datetime | None = None, conn=None) -> Spend:
        now = now or self._clock()
        if conn is None:
            with self.engine.connect() as own:
                return self.spend(customer_id, now=now, conn=own)
        month_start, month_end = month_window(now)
        rows = conn.execute(
            _SPEND_SQL, dict(customer_id=customer_id, month_start=month_start, month_end=month_end, now=now)
        ).all()
        metered = settled = reserved = _ZERO
        for row in rows:
            if row.part == "metered":
                metered += list_price(row.model, self.settings).cost(
                    uncached_input_tokens=int(row.uncached or 0),
                    cached_input_tokens=int(row.cached or 0),
                    output_tokens=int(row.output or 0),
                )
            elif row.part == "settled":
                settled += Decimal(row.amount)
            else:
                reserved += Decimal(row.amount)
        return Spend(metered, settled, reserved)

    def admit_sync(
        self,
        customer_id: str,
        *,
        model: str,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        now: datetime | None = None,
    ) -> Admitted | Rejected:
        """Admit or reject one request; an admitted request of a limited customer holds a reservation."""
        if self._known_unlimited(customer_id):
            return Admitted(request_id, customer_id)
        now = now or self._clock()
        price = list_price(model, self.settings)
        worst = price.cost(uncached_input_tokens=prompt_tokens, cached_input_tokens=0, output_tokens=max_tokens)
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
                    if config.mode == "hard":
                        return Rejected(
                            reason="budget_exceeded",
                            message=f"Your {text_}. Raise the budget or wait for the next month.",
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
        month_start, _ = month_window(now)
        with self.engine.begin() as conn:
            conn.execute(_HOUSEKEEP_SQL, dict(customer_id=customer_id, now=now, month_start=month_start))
            ratelimit.forget_old_windows(conn, customer_id, now)

    def _maybe_housekeep(self, customer_id: str, now: datetime) -> None:
        last = self._housekept.get(customer_id, 0.0)
        if time.monotonic() - last >= self._housekeep_every_s:
            self._housekept[customer_id] = time.monotonic()
            self.housekeep(customer_id, now)
