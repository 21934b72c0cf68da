"""Customer API keys: created once, shown once, stored hashed, revocable within seconds.

Public API (the gateway codes against this):

    store = KeyStore(engine, settings=None, cache_ttl_s=None, clock=time.monotonic)
    key_id, secret = store.create(customer_id, project_id=None)   # secret shown ONCE
    store.list(customer_id) -> list[ApiKey]                        # never returns secrets
    store.revoke(key_id) -> bool                                   # False: no such active key
    key_id, secret = store.kept(customer_id, path)                 # the key kept in path (0600), or a new one
    principal = await store.authenticate(token)                    # infermeter.auth.Principal
    principal = store.authenticate_sync(token)                     # same, blocking (CLI, tests)

`authenticate` raises `infermeter.auth.AuthError` for a malformed, unknown or revoked key; the
gateway answers 401. The admin and producer tokens of the settings
(INFERMETER_ADMIN_TOKEN / INFERMETER_PRODUCER_TOKEN) resolve through
`infermeter.auth.static_principal` first, so admin credentials are never customer keys.

Key format: `im_live_<key id: 16 hex>_<secret: 32 random bytes, urlsafe base64>`. The key id
is public (it appears in `list`, in usage events as `api_key_id`, and in logs). The database
keeps SHA-256(secret). A slow password hash (argon2/scrypt) protects low-entropy human
passwords; this secret carries 256 bits of entropy, so a fast hash is as safe here and keeps
authentication at a few microseconds on the gateway's hot path.

Revocation on every gateway process: each process caches a *positive* lookup for at most
`cache_ttl_s` (INFERMETER_KEY_CACHE_TTL_S, default 2 s). A revoked key therefore stops
working everywhere within that TTL. Key ids that do not exist or are revoked are remembered
as refused for the same TTL (neither can become valid again); a wrong secret for a valid key
id is never remembered, so it cannot lock the real key out. Cache misses cost one primary-key
lookup, done in a worker thread so the event loop never blocks; concurrent misses of one key share
it, and a key in use is read again in the background shortly before its entry expires, so its
requests do not wait for the database (serving/single_flight.py). An entry is never used past its
expiry. The lookup also reads the customer's regions and whether it has a budget row, and primes
the gateway's residency cache and admission's no-limits entry with them (`residency`, `admission`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from infermeter.auth import AuthError, Principal, static_principal
from infermeter.settings import Settings, get_settings
from serving.single_flight import SingleFlight, due
from serving.tables import api_keys, customer_budgets, customer_residency

KEY_PREFIX = "im_live_"
_KEY_ID_HEX = 16
_HEX = "0123456789abcdef"
_MAX_REFUSED = 10_000


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    customer_id: str
    project_id: str | None
    display_prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class _Cached:
    expires_at: float
    secret_sha256: bytes
    principal: Principal


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_token(token: str) -> tuple[str, str]:
    """(key id, secret) of a customer key; AuthError when the token is not one."""
    if not token.startswith(KEY_PREFIX):
        raise AuthError("invalid API key")
    rest = token[len(KEY_PREFIX) :]
    key_id, sep, secret = rest[:_KEY_ID_HEX], rest[_KEY_ID_HEX : _KEY_ID_HEX + 1], rest[_KEY_ID_HEX + 1 :]
    # key_id.strip(_HEX) is empty exactly when every character of it is a lowercase hex digit
    if sep != "_" or len(secret) < 20 or len(key_id) != _KEY_ID_HEX or key_id.strip(_HEX):
        raise AuthError("invalid API key")
    return key_id, secret


# The columns of an ApiKey, in its field order.
_KEY_COLUMNS = (
    api_keys.c.key_id,
    api_keys.c.customer_id,
    api_keys.c.project_id,
    api_keys.c.display_prefix,
    api_keys.c.created_at,
    api_keys.c.revoked_at,
)


class KeyStore:
    def __init__(
        self,
        engine: Engine,
        settings: Settings | None = None,
        *,
        cache_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.settings = settings or get_settings()
        self.cache_ttl_s = self.settings.key_cache_ttl_s if cache_ttl_s is None else cache_ttl_s
        self._clock = clock
        self._cache: dict[str, _Cached] = {}
        # Key ids known NOT to authenticate (no such id, or revoked): neither can become valid
        # again (ids are random, revocation is final), so remembering them is safe; it keeps a
        # flood of bad keys off the database. Bounded: cleared when it grows past the limit.
        self._unknown: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        # The gateway's serving.residency.ResidencyCache: each lookup reads the customer's regions in
        # the same statement and primes it, so residency costs a request with a cached key nothing.
        self.residency = None
        # The gateway's serving.budgets.AdmissionController: each lookup reads in the same statement
        # whether the customer has a budget row and primes its no-limits entry, so the first request
        # after an idle spell waits for one lookup, not for this one and then admission's check.
        self.admission = None
        # (admin token, producer token), read once: each read of a Settings property costs ~10 us
        # (pydantic attribute access, generated credentials), twice per request otherwise.
        self._static_tokens: tuple[str, str] | None = None
        self._flights = SingleFlight("API keys")  # one lookup per key at a time (serving/single_flight.py)

    # --- administration -------------------------------------------------------------------

    def create(self, customer_id: str, project_id: str | None = None) -> tuple[str, str]:
        """A new key for the customer: (key id, full secret token). The token is never stored."""
        if not customer_id:
            raise ValueError("customer_id must not be empty")
        key_id = secrets.token_hex(_KEY_ID_HEX // 2)
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        token = f"{KEY_PREFIX}{key_id}_{secret}"
        with self.engine.begin() as conn:
            conn.execute(
                api_keys.insert().values(
                    key_id=key_id,
                    customer_id=customer_id,
                    project_id=project_id,
                    secret_sha256=_hash(secret),
                    display_prefix=f"{KEY_PREFIX}{key_id}_{secret[:4]}...",
                )
            )
        return key_id, token

    def list(self, customer_id: str, *, include_revoked: bool = True) -> list[ApiKey]:
        query = select(*_KEY_COLUMNS).where(api_keys.c.customer_id == customer_id)
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(api_keys.c.created_at, api_keys.c.key_id)).all()
        return [ApiKey(*row) for row in rows]

    def get(self, key_id: str) -> ApiKey | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(*_KEY_COLUMNS).where(api_keys.c.key_id == key_id)).first()
        return ApiKey(*row) if row else None

    def revoke(self, key_id: str, *, now: datetime | None = None) -> bool:
        """Revoke an active key; True if it was active. Other processes see it within the cache TTL."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now or datetime.now(UTC))
            )
        with self._lock:
            self._cache.pop(key_id, None)
        return result.rowcount == 1

    def kept(self, customer_id: str, path: Path, project_id: str | None = None) -> tuple[str, str]:
        """The customer's key kept in `path` (JSON, mode 0600) by an earlier run while it is still
        active, else a new one, kept there: (key id, token). For commands that print a ready-to-use
        key on each start (`demo`, `up --serving`): a restart reuses it instead of leaving one more
        active key behind each time."""
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            found = json.loads(path.read_text())
            key = self.get(found["key_id"])
            if key is not None and key.active and key.customer_id == customer_id:
                return found["key_id"], found["key"]
        key_id, token = self.create(customer_id, project_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump({"customer_id": customer_id, "key_id": key_id, "key": token}, out)
        return key_id, token

    # --- authentication ---------------------------------------------------------------------

    def _static(self, token: str) -> Principal | None:
        tokens = self._static_tokens
        if tokens is None:
            tokens = self._static_tokens = (self.settings.admin_token, self.settings.producer_token)
        return static_principal(token, *tokens)

    def _from_cache(self, key_id: str, secret: str) -> Principal | None:
        return self._cached(key_id, secret)[0]

    def _cached(self, key_id: str, secret: str) -> tuple[Principal | None, bool]:
        """(the cached principal or None, whether its entry is due for a refresh)."""
        now = self._clock()
        refused = self._unknown.get(key_id)
        if refused is not None and refused[0] > now:
            raise AuthError(refused[1])
        entry = self._cache.get(key_id)
        if entry is None or entry.expires_at <= now:
            return None, False
        if not hmac.compare_digest(entry.secret_sha256, _hash(secret)):
            raise AuthError("invalid API key")
        return entry.principal, due(entry.expires_at, self.cache_ttl_s, now)

    async def session_principal(self, key_id: str) -> Principal | None:
        """The principal of the key a signed-in session was opened with (the session's signed cookie
        names the key; no secret): from the verified-key cache while its entry lives, as a bearer call
        with the key would be, else read (and cached) in a worker thread; None for an unknown or
        revoked key (revoked here: at once; in another process: within the cache TTL, as for bearer
        keys)."""
        refused = self._unknown.get(key_id)
        if refused is not None and refused[0] > self._clock():
            return None
        entry = self._cache.get(key_id)
        if entry is not None and entry.expires_at > self._clock():
            return entry.principal
        return await self._flights.run((key_id, None), self._lookup, key_id, None)

    def _lookup(self, key_id: str, secret: str | None) -> Principal | None:
        """The principal of key `key_id` with `secret` (AuthError otherwise), cached; with `secret` None
        (a session's key, `session_principal`) the secret is not checked and None means refused."""
        query = select(
            api_keys.c.customer_id,
            api_keys.c.project_id,
            api_keys.c.secret_sha256,
            api_keys.c.revoked_at,
            customer_residency.c.regions,
            customer_budgets.c.customer_id.label("budget_of"),
        ).select_from(
            api_keys.outerjoin(customer_residency, customer_residency.c.customer_id == api_keys.c.customer_id)
            .outerjoin(customer_budgets, customer_budgets.c.customer_id == api_keys.c.customer_id)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query.where(api_keys.c.key_id == key_id)).first()
        if row is None:
            self._refuse(key_id, "invalid API key")
            if secret is None:
                return None
            raise AuthError("invalid API key")
        if secret is not None and not hmac.compare_digest(bytes(row.secret_sha256), _hash(secret)):
            raise AuthError("invalid API key")  # not remembered: the key id itself is valid
        if row.revoked_at is not None:
            with self._lock:
                self._cache.pop(key_id, None)
            self._refuse(key_id, "API key has been revoked")
            if secret is None:
                return None
            raise AuthError("API key has been revoked")
        principal = Principal(kind="customer", customer_id=row.customer_id, api_key_id=key_id, project_id=row.project_id)
        if self.cache_ttl_s > 0:
            with self._lock:
                self._cache[key_id] = _Cached(self._clock() + self.cache_ttl_s, bytes(row.secret_sha256), principal)
        if self.residency is not None:  # after the key's entry, so the regions never expire first
            self.residency.prime(row.customer_id, row.regions)
        if self.admission is not None:
            self.admission.prime(row.customer_id, has_budget=row.budget_of is not None)
        return principal

    def _refuse(self, key_id: str, reason: str) -> None:
        if self.cache_ttl_s <= 0:
            return
        with self._lock:
            if len(self._unknown) >= _MAX_REFUSED:
                self._unknown.clear()
            self._unknown[key_id] = (self._clock() + self.cache_ttl_s, reason)

    async def authenticate(self, token: str) -> Principal:
        """The principal of a bearer token (admin, producer or customer key); AuthError otherwise.
        A cached key near its expiry is read again in the background (serving/single_flight.py)."""
        if (principal := self._static(token)) is not None:
            return principal
        key_id, secret = parse_token(token)
        principal, refresh = self._cached(key_id, secret)
        if principal is None:
            return await self._flights.run((key_id, secret), self._lookup, key_id, secret)
        if refresh:
            self._flights.refresh((key_id, secret), self._lookup, key_id, secret)
        return principal

    def authenticate_sync(self, token: str) -> Principal:
        if (principal := self._static(token)) is not None:
            return principal
        key_id, secret = parse_token(token)
        if (principal := self._from_cache(key_id, secret)) is not None:
            return principal
        return self._lookup(key_id, secret)
