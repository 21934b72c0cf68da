"""Dashboard sessions and CSRF tokens: HMAC-signed cookies, and the sessions' record in PostgreSQL.

- The session cookie (`im_session`) carries the session's id, who signed in — a customer (its
  customer id and the id of the API key it signed in with, never the key itself) or the admin (a
  fingerprint of the admin token, so changing the token ends every admin session) — and when the
  session expires (INFERMETER_SESSION_TTL_S). It is signed with HMAC-SHA256 under the server secret
  (INFERMETER_SESSION_SECRET, or one generated in INFERMETER_HOME), HttpOnly, SameSite=Lax, and
  Secure when the request came over https.
- Every session is a row of `dashboard_sessions` (`SessionStore`), written at sign-in and marked
  ended at sign-out: the processes serving the pages share PostgreSQL, so a session signed out in
  one is refused by all. Each process checks a request's session there through a short cache
  (INFERMETER_SESSION_CACHE_TTL_S): the process that signed out refuses the session at once, the
  others within the cache's TTL.
- CSRF: a random nonce in its own cookie (`im_csrf`, HttpOnly, SameSite=Lax); every form carries
  HMAC(secret, nonce) in a hidden field, and a POST whose field does not match its cookie is
  refused. Signing in replaces the nonce.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import CheckConstraint, Column, Index, Table, Text, func

from infermeter.db import metadata, timestamp_column

SESSION_COOKIE = "im_session"
CSRF_COOKIE = "im_csrf"
CSRF_FIELD = "csrf"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """HMAC-SHA256 signatures under a key derived from the server secret (one derivation per use)."""

    def __init__(self, secret: str):
        self._session_key = hashlib.sha256(b"infermeter-dashboard-session|" + secret.encode()).digest()
        self._csrf_key = hashlib.sha256(b"infermeter-dashboard-csrf|" + secret.encode()).digest()
        self._fp_key = hashlib.sha256(b"infermeter-dashboard-admin|" + secret.encode()).digest()

    def sign(self, payload: dict) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        mac = _b64(hmac.new(self._session_key, body.encode(), hashlib.sha256).digest())
        return f"{body}.{mac}"

    def unsign(self, text: str | None) -> dict | None:
        if not text or text.count(".") != 1:
            return None
        body, mac = text.split(".")
        expected = _b64(hmac.new(self._session_key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(mac, expected):
            return None
        try:
            payload = json.loads(_unb64(body))
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None

    def csrf_token(self, nonce: str) -> str:
        return _b64(hmac.new(self._csrf_key, nonce.encode(), hashlib.sha256).digest())

    def csrf_ok(self, nonce: str | None, token: str | None) -> bool:
        return bool(nonce and token) and hmac.compare_digest(self.csrf_token(nonce), token)

    def admin_fingerprint(self, admin_token: str) -> str:
        return _b64(hmac.new(self._fp_key, admin_token.encode(), hashlib.sha256).digest())[:22]


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def new_session_id() -> str:
    return secrets.token_urlsafe(18)


@dataclass(frozen=True)
class Session:
    kind: Literal["customer", "admin"]
    expires_at: float
    customer_id: str | None = None
    key_id: str | None = None
    admin_fingerprint: str | None = None
    session_id: str = ""  # its row in dashboard_sessions; "" (a cookie from before sessions had one): no session

    def to_payload(self) -> dict:
        return {"k": self.kind, "e": self.expires_at, "c": self.customer_id, "i": self.key_id,
                "f": self.admin_fingerprint, "s": self.session_id}

    @classmethod
    def from_payload(cls, payload: dict) -> Session | None:
        kind, expires, session_id = payload.get("k"), payload.get("e"), payload.get("s", "")
        if kind not in ("customer", "admin") or not isinstance(expires, int | float) or not isinstance(session_id, str):
            return None
        return cls(kind, float(expires), payload.get("c"), payload.get("i"), payload.get("f"), session_id)


SessionState = Literal["none", "invalid", "expired", "ok"]


def read_session(signer: Signer, cookie: str | None, *, now: float | None = None) -> tuple[SessionState, Session | None]:
    """What the cookie says: no session, a forged/garbled one, an expired one, or a live one."""
    if not cookie:
        return "none", None
    payload = signer.unsign(cookie)
    session = Session.from_payload(payload) if payload is not None else None
    if session is None:
        return "invalid", None
    if session.expires_at <= (time.time() if now is None else now):
        return "expired", session
    return "ok", session


# --- the sessions' record: which sessions are live, shared by every process ------------------------

dashboard_sessions = Table(
    "dashboard_sessions",
    metadata,
    Column("session_id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("customer_id", Text, nullable=True),
    Column("api_key_id", Text, nullable=True),
    timestamp_column("created_at", nullable=False, server_default=func.now()),
    timestamp_column("expires_at", nullable=False),
    timestamp_column("ended_at", nullable=True),  # signed out
    CheckConstraint("kind IN ('customer', 'admin')", name="dashboard_sessions_kind"),
)
Index("dashboard_sessions_expires", dashboard_sessions.c.expires_at)

_MAX_CACHED = 10_000


class SessionStore:
    """The live dashboard sessions, in `dashboard_sessions` (psycopg `pool`: the pages' sync pool).

    `start` records a session at sign-in, `end` marks it ended at sign-out, and `is_live` says whether
    a request's session may still be used: from this process's cache while its entry is younger than
    `cache_ttl_s` (INFERMETER_SESSION_CACHE_TTL_S), else one primary-key read. Ending a session here
    updates the cache at once; another process sees it when its entry expires. An ended session can
    never become live again, so both answers are cached alike."""

    def __init__(self, pool, *, cache_ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, bool]] = {}  # session id -> (entry good until, live)
        self._lock = threading.Lock()

    def start(self, session: Session) -> None:
        """Record a new session, and delete the rows of sessions expired for a day (their cookies are refused
        as expired before this record is read)."""
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM dashboard_sessions WHERE expires_at < now() - interval '1 day'")
            conn.execute("INSERT INTO dashboard_sessions (session_id, kind, customer_id, api_key_id, expires_at) "
                         "VALUES (%s, %s, %s, %s, %s)",
                         (session.session_id, session.kind, session.customer_id, session.key_id,
                          datetime.fromtimestamp(session.expires_at, UTC)))
        self._remember(session.session_id, True)

    def end(self, session_id: str) -> None:
        """Sign-out: the session is refused from now on (here at once, elsewhere within the cache TTL)."""
        with self._pool.connection() as conn:
            conn.execute("UPDATE dashboard_sessions SET ended_at = now() WHERE session_id = %s AND ended_at IS NULL",
                         (session_id,))
        self._remember(session_id, False)

    async def is_live(self, session_id: str) -> bool:
        """Whether the session was started and has not ended (its expiry is the cookie's to check)."""
        if not session_id:
            return False
        entry = self._cache.get(session_id)
        if entry is not None and entry[0] > self._clock():
            return entry[1]
        return await asyncio.to_thread(self._read, session_id)

    def _read(self, session_id: str) -> bool:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT ended_at IS NULL FROM dashboard_sessions WHERE session_id = %s",
                               (session_id,)).fetchone()
        live = bool(row and row[0])
        self._remember(session_id, live)
        return live

    def _remember(self, session_id: str, live: bool) -> None:
        if self.cache_ttl_s <= 0:
            return
        with self._lock:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[session_id] = (self._clock() + self.cache_ttl_s, live)
