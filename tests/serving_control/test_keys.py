"""API keys: shown once, stored hashed, authenticated, revoked everywhere within seconds."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest
from sqlalchemy import select

from infermeter.auth import AuthError
from serving.keys import KEY_PREFIX, KeyStore
from serving.tables import api_keys


def test_create_stores_only_a_hash_and_authenticates(engine, settings):
    store = KeyStore(engine, settings)
    key_id, token = store.create("cust-a", project_id="proj-1")
    assert token.startswith(KEY_PREFIX + key_id + "_")
    with engine.connect() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.key_id == key_id)).one()
    secret = token.split("_", 3)[3]
    assert bytes(row.secret_sha256) == hashlib.sha256(secret.encode()).digest()
    assert secret not in repr(tuple(row))  # the secret itself is nowhere in the row
    principal = asyncio.run(store.authenticate(token))
    assert (principal.kind, principal.customer_id, principal.api_key_id, principal.project_id) == (
        "customer", "cust-a", key_id, "proj-1")


def test_list_shows_keys_of_one_customer_without_secrets(engine, settings):
    store = KeyStore(engine, settings)
    k1, t1 = store.create("cust-a")
    k2, _ = store.create("cust-a")
    store.create("cust-b")
    keys = store.list("cust-a")
    assert {k.key_id for k in keys} == {k1, k2}
    assert all(t1 not in k.display_prefix for k in keys)
    store.revoke(k1)
    assert {k.key_id for k in store.list("cust-a", include_revoked=False)} == {k2}


def test_a_kept_key_is_reused_while_active_and_replaced_once_revoked(engine, settings, tmp_path):
    store = KeyStore(engine, settings)
    path = tmp_path / "serving" / "key-cust-k.json"
    key_id, token = store.kept("cust-k", path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert store.kept("cust-k", path) == (key_id, token)  # a restart: the same key, no new one
    assert [k.key_id for k in store.list("cust-k")] == [key_id]
    assert store.authenticate_sync(token).customer_id == "cust-k"
    store.revoke(key_id)
    new_id, new_token = store.kept("cust-k", path)
    assert new_id != key_id and store.authenticate_sync(new_token).api_key_id == new_id
    # a file of another customer's key, or one that is not JSON: a new key, never the other's
    assert store.kept("cust-other", path)[0] not in (key_id, new_id)
    path.write_text("not json")
    other = store.kept("cust-k", path)
    assert other[0] not in (key_id, new_id) and store.kept("cust-k", path) == other


@pytest.mark.parametrize(
    "token",
    ["", "sk-something", KEY_PREFIX + "nothex", KEY_PREFIX + "0123456789abcdef_" + "x" * 43, "dev-admin-tokenX"],
)
def test_bad_tokens_are_rejected(engine, settings, token):
    with pytest.raises(AuthError):
        KeyStore(engine, settings).authenticate_sync(token)


def test_right_key_id_wrong_secret_is_rejected_even_when_cached(engine, settings):
    store = KeyStore(engine, settings)
    key_id, token = store.create("cust-a")
    store.authenticate_sync(token)  # now cached
    with pytest.raises(AuthError):
        store.authenticate_sync(f"{KEY_PREFIX}{key_id}_{'A' * 43}")


def test_admin_and_producer_tokens_are_separate_from_customer_keys(engine, settings):
    store = KeyStore(engine, settings)
    assert store.authenticate_sync(settings.admin_token).kind == "admin"
    assert store.authenticate_sync(settings.producer_token).kind == "producer"
    _, token = store.create("cust-a")
    assert store.authenticate_sync(token).kind == "customer"


def test_revocation_reaches_a_second_process_within_the_cache_ttl(engine, other_engine, settings):
    gateway_1 = KeyStore(engine, settings, cache_ttl_s=1.0)
    gateway_2 = KeyStore(other_engine, settings, cache_ttl_s=1.0)
    key_id, token = gateway_1.create("cust-a")
    assert asyncio.run(gateway_2.authenticate(token)).customer_id == "cust-a"  # cached in gateway 2
    assert gateway_1.revoke(key_id)
    assert not gateway_1.revoke(key_id)  # already revoked
    with pytest.raises(AuthError):
        gateway_1.authenticate_sync(token)  # the revoking process: at once
    revoked_at = time.monotonic()
    while True:  # the other process: as soon as its cache entry expires
        try:
            gateway_2.authenticate_sync(token)
        except AuthError:
            break
        assert time.monotonic() - revoked_at < 3.0, "revocation not visible soon after the 1 s TTL"
        time.sleep(0.05)
    # and it stays revoked
    with pytest.raises(AuthError, match="revoked"):
        asyncio.run(gateway_2.authenticate(token))


def test_refused_key_ids_are_remembered_but_a_wrong_secret_never_locks_out_the_real_key(engine, settings):
    store = KeyStore(engine, settings, cache_ttl_s=60)
    key_id, token = store.create("cust-a")
    with pytest.raises(AuthError):
        store.authenticate_sync(f"{KEY_PREFIX}{key_id}_{'B' * 43}")  # wrong secret, not cached yet
    assert store.authenticate_sync(token).customer_id == "cust-a"  # the real key still works
    unknown = f"{KEY_PREFIX}{'0' * 16}_{'C' * 43}"
    with pytest.raises(AuthError):
        store.authenticate_sync(unknown)
    lookups = []
    store._lookup = lambda *a: lookups.append(a)  # type: ignore[method-assign]
    with pytest.raises(AuthError, match="invalid"):
        store.authenticate_sync(unknown)  # remembered: no database lookup
    assert lookups == []


def test_a_sessions_key_comes_from_the_verified_key_cache_and_revocation_ends_it(engine, other_engine, settings):
    """A dashboard session names its key (no secret): `session_principal` answers from the verified-key
    cache as a bearer call does, reads the database only when the entry is missing or expired, and a
    revoked key ends the session at once in the revoking process, within the TTL in another."""
    web = KeyStore(engine, settings, cache_ttl_s=1.0)
    admin = KeyStore(other_engine, settings, cache_ttl_s=1.0)
    key_id, token = admin.create("cust-a", project_id="proj-1")
    principal = asyncio.run(web.session_principal(key_id))
    assert (principal.kind, principal.customer_id, principal.api_key_id, principal.project_id) == (
        "customer", "cust-a", key_id, "proj-1")
    assert asyncio.run(web.authenticate(token)) == principal  # what a bearer call with the key gets
    lookups: list[tuple] = []
    real = web._lookup
    web._lookup = lambda *a: lookups.append(a) or real(*a)  # type: ignore[method-assign]
    assert asyncio.run(web.session_principal(key_id)) == principal
    assert lookups == []  # cached: no database read
    assert admin.revoke(key_id)  # another process revokes it
    revoked_at = time.monotonic()
    while asyncio.run(web.session_principal(key_id)) is not None:
        assert time.monotonic() - revoked_at < 3.0, "revocation not visible soon after the 1 s TTL"
        time.sleep(0.05)
    assert asyncio.run(web.session_principal(key_id)) is None  # and it stays revoked
    other_id, _ = web.create("cust-a")
    assert asyncio.run(web.session_principal(other_id)) is not None
    assert web.revoke(other_id)
    assert asyncio.run(web.session_principal(other_id)) is None  # the revoking process: at once
    assert asyncio.run(web.session_principal("0" * 16)) is None  # no such key


def test_misses_of_one_key_share_a_lookup_and_a_key_in_use_is_read_again_before_it_expires(engine, settings):
    """Ten concurrent requests with an uncached key: one database read. A request in the last
    quarter of the entry's lifetime is answered from the cache and the key is read again in the
    background; a revocation found that way ends the key at once; an expired entry is never used."""
    now = [100.0]
    store = KeyStore(engine, settings, cache_ttl_s=2.0, clock=lambda: now[0])
    key_id, token = store.create("cust-a")
    lookups: list[tuple] = []
    real = store._lookup
    store._lookup = lambda *a: lookups.append(a) or real(*a)  # type: ignore[method-assign]

    async def burst() -> list:
        return await asyncio.gather(*(store.authenticate(token) for _ in range(10)))

    async def background_lookups(count: int) -> None:
        while len(lookups) < count or store._flights._flights:
            await asyncio.sleep(0.01)

    assert {p.customer_id for p in asyncio.run(burst())} == {"cust-a"} and len(lookups) == 1
    now[0] = 101.4  # 0.6 s left of 2: cached, not due
    asyncio.run(store.authenticate(token))
    assert len(lookups) == 1

    async def near_expiry_then(count: int) -> None:
        assert (await store.authenticate(token)).customer_id == "cust-a"  # answered from the cache
        await asyncio.wait_for(background_lookups(count), 10)

    now[0] = 101.6  # 0.4 s left: due
    asyncio.run(near_expiry_then(2))
    assert len(lookups) == 2 and store._cache[key_id].expires_at == 103.6  # read again: 2 s from now
    now[0] = 103.7  # expired: never used, read (one lookup for the burst)
    assert {p.customer_id for p in asyncio.run(burst())} == {"cust-a"} and len(lookups) == 3
    assert KeyStore(engine, settings).revoke(key_id)  # another process revokes it

    now[0] = 105.5  # due again: still answered from the cache (within the TTL), and the read finds it revoked
    asyncio.run(near_expiry_then(4))
    with pytest.raises(AuthError, match="revoked"):
        asyncio.run(store.authenticate(token))  # at once, before the entry's own expiry (105.7)
    assert len(lookups) == 4
