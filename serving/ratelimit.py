"""Rate limits per customer: requests per minute (RPM) and tokens per minute (TPM).

Public API: used inside `serving.budgets.AdmissionController.admit` (one transaction, under the
customer's budget-row lock), so the gateway only calls `admit`/`settle`. Pure helpers:

    window_start(now) -> datetime                         # the minute [start, start + 60 s)
    sliding_estimate(prev, cur, now) -> float             # previous minute weighted + current
    check(limits, prev_window, cur_window, now, tokens) -> RateDecision
    charge(conn, customer_id, start, requests, tokens)    # +requests, +tokens in the minute row
                                                          # (admit fuses this with its reservation)
    adjust_tokens(conn, customer_id, window_start, delta) # settle: worst case -> actual tokens

Algorithm: sliding-window counter. Counters live in `rate_windows` (customer, minute) in
Postgres, shared by every gateway process; the estimate for the last 60 s is
`previous_minute * (1 - elapsed_fraction) + current_minute`. A request is admitted if
estimate + 1 <= RPM and estimated tokens + (prompt_tokens + max_tokens) <= TPM. TPM charges
the worst case at admission (like OpenAI) and is corrected to the actual tokens at
settlement. Rejections carry Retry-After (seconds until enough of the window slides out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection

from serving.tables import rate_windows

WINDOW = timedelta(seconds=60)


@dataclass(frozen=True)
class WindowCount:
    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    reason: str | None = None  # rate_limit_requests | rate_limit_tokens
    message: str = ""
    retry_after_s: int = 0


def window_start(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


def sliding_estimate(previous: float, current: float, now: datetime) -> float:
    """Requests (or tokens) in the last 60 s, assuming the previous minute's were spread evenly."""
    elapsed = (now - window_start(now)).total_seconds() / WINDOW.total_seconds()
    return previous * (1.0 - elapsed) + current


def _retry_after(now: datetime) -> int:
    return max(1, math.ceil((window_start(now) + WINDOW - now).total_seconds()))


def check(
    rpm: int | None, tpm: int | None, previous: WindowCount, current: WindowCount, now: datetime, tokens: int
) -> RateDecision:
    """Pure: may one more request charging `tokens` go now?"""
    if rpm is not None:
        used = sliding_estimate(previous.requests, current.requests, now)
        if used + 1 > rpm + 1e-9:
            retry = _retry_after(now)
            return RateDecision(
                False,
                "rate_limit_requests",
                f"Rate limit reached: {rpm} requests per minute. Retry after {retry} s.",
                retry,
            )
    if tpm is not None:
        used = sliding_estimate(previous.tokens, current.tokens, now)
        if used + tokens > tpm + 1e-9:
            retry = _retry_after(now)
            if tokens > tpm:
                message = (
                    f"Request too large: it may use {tokens} tokens (prompt + max_tokens), "
                    f"more than the limit of {tpm} tokens per minute. Lower max_tokens."
                )
            else:
                message = f"Rate limit reached: {tpm} tokens per minute. Retry after {retry} s."
            return RateDecision(False, "rate_limit_tokens", message, retry)
    return RateDecision(True)


def load(conn: Connection, customer_id: str, now: datetime) -> tuple[WindowCount, WindowCount]:
    """(previous minute, current minute) counters of the customer."""
    start = window_start(now)
    rows = conn.execute(
        select(rate_windows.c.window_start, rate_windows.c.requests, rate_windows.c.tokens).where(
            and_(
                rate_windows.c.customer_id == customer_id,
                rate_windows.c.window_start.in_([start - WINDOW, start]),
            )
        )
    ).all()
    counts = {row.window_start: WindowCount(int(row.requests), int(row.tokens)) for row in rows}
    return counts.get(start - WINDOW, WindowCount()), counts.get(start, WindowCount())


def charge(conn: Connection, customer_id: str, start: datetime, requests: int, tokens: int) -> None:
    statement = insert(rate_windows).values(customer_id=customer_id, window_start=start, requests=requests, tokens=tokens)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[rate_windows.c.customer_id, rate_windows.c.window_start],
            set_={
                "requests": rate_windows.c.requests + statement.excluded.requests,
                "tokens": rate_windows.c.tokens + statement.excluded.tokens,
            },
        )
    )


def adjust_tokens(conn: Connection, customer_id: str, start: datetime, delta: int) -> None:
    if delta:
        conn.execute(
            update(rate_windows)
            .where(rate_windows.c.customer_id == customer_id, rate_windows.c.window_start == start)
            .values(tokens=rate_windows.c.tokens + delta)
        )


def forget_old_windows(conn: Connection, customer_id: str, now: datetime) -> None:
    conn.execute(
        rate_windows.delete().where(
            rate_windows.c.customer_id == customer_id, rate_windows.c.window_start < window_start(now) - WINDOW
        )
    )
