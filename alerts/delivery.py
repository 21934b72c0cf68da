"""Sending alerts: each pending delivery POSTed to its endpoint, signed (`alerts.signing`), retried with
exponential backoff until the endpoint answers 2xx or the attempts run out.

- `Policy`: attempts in all, the first retry's delay (it doubles after each failed attempt, at most
  MAX_DELAY_S), the timeout of an attempt (settings INFERMETER_ALERT_RETRY_ATTEMPTS, _RETRY_BASE_S,
  _TIMEOUT_S).
- `deliver_due(conn, policy, now=...)`: one attempt of every delivery due by `now`. Each is claimed
  in one short transaction (`SELECT ... FOR UPDATE SKIP LOCKED`, then its attempt time and a lease:
  not due again before the lease runs out, `Policy.lease_s`), POSTed with no transaction open (a slow
  receiver holds no row lock), and its result recorded if the claim still stands (the delivery still
  pending with this attempt's time: a sender that took it over after the lease ran out, or a
  cancellation, is not overwritten). So two processes do not send one delivery at the same time
  (unless a POST outlasts its lease). At least once: a process that dies after the POST and before
  recording it leaves the delivery to be sent again when the lease runs out, with the same delivery id
  and body, and a receiver that keeps the ids it processed recognises it (docs/alerts.md).
- `deliver(conn, policy, ids, clock=..., sleep=...)`: attempt these deliveries until each is
  delivered or failed, sleeping through the backoff (`infermeter alerts test`, `alerts evaluate`).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from alerts.signing import DELIVERY_HEADER, SIGNATURE_HEADER, signature_header
from infermeter.times import utc_now

MAX_DELAY_S = 3600.0
LEASE_MARGIN_S = 60.0  # a claimed delivery is not due again before its attempt's timeout + this
USER_AGENT = "infermeter-alerts/1"


@dataclass(frozen=True)
class Policy:
    attempts: int = 6
    base_s: float = 2.0
    timeout_s: float = 10.0

    @classmethod
    def of(cls, settings) -> Policy:
        return cls(settings.alert_retry_attempts, settings.alert_retry_base_s, settings.alert_timeout_s)

    @property
    def lease_s(self) -> float:
        """How long a claimed delivery is not due again: the attempt's timeout and a margin. A sender that
        died mid-attempt leaves it to any sender once this has passed."""
        return self.timeout_s + LEASE_MARGIN_S

    def delay_after(self, attempt: int) -> float:
        """Seconds from failed attempt `attempt` (1, 2, ...) to the next: base x 2^(attempt-1), at most an hour."""
        return min(MAX_DELAY_S, self.base_s * 2 ** (attempt - 1))


@dataclass(frozen=True)
class Attempt:
    delivery_id: str
    attempt: int
    ok: bool
    status: int | None  # the HTTP status the endpoint answered, None when it did not answer
    error: str | None
    outcome: str  # the delivery's status after it: delivered, pending (to retry), failed


def post(url: str, secret: str, delivery: str, body: bytes, *, timestamp: int, timeout_s: float) -> tuple[int | None, str | None]:
    """POST one signed attempt: (the HTTP status, None) or (None or the status, why it failed)."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": USER_AGENT, DELIVERY_HEADER: delivery,
        SIGNATURE_HEADER: signature_header(secret, timestamp, body)})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) checked on set
            response.read(65536)
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{type(reason).__name__}: {reason}"[:500]


_CLAIM = """
SELECT d.delivery_id, d.url, d.body, d.attempts, e.secret
FROM alert_deliveries d JOIN alert_endpoints e USING (endpoint_id)
WHERE d.status = 'pending' AND d.next_attempt_at <= %(now)s
  AND (%(only)s::text[] IS NULL OR d.delivery_id = ANY(%(only)s))
ORDER BY d.next_attempt_at, d.delivery_id
LIMIT 1
FOR UPDATE OF d SKIP LOCKED
"""

# the claim: this attempt's time, and not due again before the lease runs out
_LEASE = "UPDATE alert_deliveries SET last_attempt_at = %s, next_attempt_at = %s WHERE delivery_id = %s"

# the result, if the claim still stands: still pending, attempted as many times, with this attempt's time
_RECORD = """
UPDATE alert_deliveries SET attempts = %(attempt)s, status = %(outcome)s, last_attempt_at = %(at)s,
  last_status = %(status)s, last_error = %(error)s, next_attempt_at = %(next_at)s,
  delivered_at = CASE WHEN %(ok)s THEN %(at)s END
WHERE delivery_id = %(ident)s AND status = 'pending' AND attempts = %(attempts)s AND last_attempt_at = %(at)s
"""


def deliver_due(conn: psycopg.Connection, policy: Policy, *, now: datetime, only: Collection[str] | None = None,
                clock: Callable[[], datetime] = utc_now, limit: int = 1000) -> list[Attempt]:
    """One attempt of each delivery due by `now` (of `only`, when given); `clock` stamps each attempt's
    signature and lease. `conn` is in autocommit mode: each claim is its own short transaction, each
    POST runs with no transaction open, each result is written on its own. An attempt whose claim no
    longer stands when it ends (see the module doc) is not recorded and not returned."""
    done: list[Attempt] = []
    skipped: set[str] = set()
    while len(done) < limit:
        with conn.transaction():
            row = conn.execute(_CLAIM, {"now": now, "only": None if only is None else list(only)}).fetchone()
            if row is None or row[0] in skipped:
                return done
            ident, url, body, attempts, secret = row
            at = clock()
            conn.execute(_LEASE, (at, at + timedelta(seconds=policy.lease_s), ident))
        attempt = attempts + 1
        status, error = post(url, secret, ident, body.encode(), timestamp=int(at.timestamp()),
                             timeout_s=policy.timeout_s)
        ok = error is None and status is not None and 200 <= status < 300
        if ok:
            outcome, next_at = "delivered", None
        elif attempt >= policy.attempts:
            outcome, next_at = "failed", None
        else:
            outcome, next_at = "pending", clock() + timedelta(seconds=policy.delay_after(attempt))
        error = None if ok else (error or f"HTTP {status}")
        recorded = conn.execute(_RECORD, {"attempt": attempt, "outcome": outcome, "at": at, "status": status,
                                          "error": error, "next_at": next_at, "ok": ok, "ident": ident,
                                          "attempts": attempts}).rowcount
        if not recorded:  # taken over after the lease ran out, or cancelled: what stands is not ours to change
            continue
        done.append(Attempt(ident, attempt, ok, status, error, outcome))
        if outcome == "pending" and next_at <= now:  # due again at once (a zero delay): next round, not this one
            skipped.add(ident)
    return done


def next_due(conn: psycopg.Connection, only: Collection[str] | None = None) -> datetime | None:
    """When the earliest pending delivery (of `only`) is due, or None if none is pending."""
    return conn.execute("SELECT min(next_attempt_at) FROM alert_deliveries WHERE status = 'pending' "
                        "AND (%(only)s::text[] IS NULL OR delivery_id = ANY(%(only)s))",
                        {"only": None if only is None else list(only)}).fetchone()[0]


def deliver(conn: psycopg.Connection, policy: Policy, ids: Collection[str], *,
            clock: Callable[[], datetime] = utc_now, sleep: Callable[[float], None] = time.sleep) -> list[Attempt]:
    """Attempt the deliveries `ids` until each is delivered or has failed its attempts, waiting out the
    backoff between attempts. Returns every attempt made, in order."""
    attempts: list[Attempt] = []
    ids = list(ids)
    while ids:
        attempts += deliver_due(conn, policy, now=clock(), only=ids, clock=clock)
        due = next_due(conn, ids)
        if due is None:
            break
        sleep(max(0.0, (due - clock()).total_seconds()))
    return attempts
