"""Dashboard sessions and CSRF tokens: HMAC-signed cookies, no server-side store.

- The session cookie (`im_session`) carries who signed in — a customer (its customer id and the id
  of the API key it signed in with, never the key itself) or the admin (a fingerprint of the admin
  token, so changing the token ends every admin session) — and when the session expires
  (INFERMETER_SESSION_TTL_S). It is signed with HMAC-SHA256 under the server secret
  (INFERMETER_SESSION_SECRET, or one generated in INFERMETER_HOME), HttpOnly, SameSite=Lax, and
  Secure when the request came over https.
- CSRF: a random nonce in its own cookie (`im_csrf`, HttpOnly, SameSite=Lax); every form carries
  HMAC(secret, nonce) in a hidden field, and a POST whose field does not match its cookie is
  refused. Signing in replaces the nonce.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Session:
    kind: Literal["customer", "admin"]
    expires_at: float
    customer_id: str | None = None
    key_id: str | None = None
    admin_fingerprint: str | None = None

    def to_payload(self) -> dict:
        return {"k": self.kind, "e": self.expires_at, "c": self.customer_id, "i": self.key_id,
                "f": self.admin_fingerprint}

    @classmethod
    def from_payload(cls, payload: dict) -> Session | None:
        kind, expires = payload.get("k"), payload.get("e")
        if kind not in ("customer", "admin") or not isinstance(expires, int | float):
            return None
        return cls(kind, float(expires), payload.get("c"), payload.get("i"), payload.get("f"))


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
