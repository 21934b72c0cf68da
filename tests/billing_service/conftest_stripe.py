"""Fixtures of the Stripe adapter tests (a plugin: test modules load it with
`pytest_plugins = ["tests.billing_service.conftest_stripe"]`, so session fixtures start once).

- `localstripe_url`: localstripe 1.15 in a subprocess on a free 127.0.0.1 port, from scratch, its state
  pickle in a private folder (removed at the end). Its own `start()` binds every interface ('::') and
  writes /tmp/localstripe.pickle on every change, so `serve_localstripe` below runs its aiohttp app
  itself: bound to 127.0.0.1 only, the pickle redirected, nothing loaded from an earlier run.
- `stripe_fake`: the strict fake (tests/billing_service/stripe_fake.py), one per session; tests keep apart by
  using their own API key (`stripe_api_key`): accounts, objects and idempotency keys are per API key.
- `CrashAfter`: a stripe-python HTTP client that lets call k reach the server, then raises `Crash` as
  if the process died before seeing the answer.
- `stripe_pg_engine`: a fresh PostgreSQL database with only the Stripe tables (create_all), on the
  session's embedded server. It does not run the migrations: 0007 follows the billing migration 0006,
  which is merged separately (once merged, `db_url` databases have the tables too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
import stripe
from sqlalchemy import create_engine

from infermeter.stack.ports import free_port, wait_for_port
from infermeter.stack.postgres import start_embedded_postgres, to_libpq_url

ROOT = Path(__file__).resolve().parents[2]


def serve_localstripe(port: int, state_dir: str, from_scratch: bool = True) -> None:
    """localstripe's `start()`, bound to 127.0.0.1, with its pickle in `state_dir` (run in a subprocess)."""
    import pickle
    import socket

    from aiohttp import web
    from localstripe import resources, server

    state = Path(state_dir) / "localstripe.pickle"

    def dump_to_disk(self) -> None:
        with open(state, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)

    def try_load_from_disk(self) -> None:
        if state.exists():
            with open(state, "rb") as f:
                self.clear()
                self.update(pickle.load(f))

    resources.Store.dump_to_disk = dump_to_disk
    resources.Store.try_load_from_disk = try_load_from_disk
    if not from_scratch:
        resources.store.try_load_from_disk()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    web.run_app(server.app, sock=sock, print=None, access_log=None)


@pytest.fixture(scope="session")
def localstripe_url():
    folder = Path(tempfile.mkdtemp(prefix="localstripe-"))
    port = free_port()
    code = (
        "import sys; from tests.billing_service.conftest_stripe import serve_localstripe; "
        "serve_localstripe(int(sys.argv[1]), sys.argv[2], from_scratch='--from-scratch' in sys.argv)"
    )
    log = open(folder / "localstripe.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "TMPDIR": str(folder), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(port), str(folder), "--from-scratch"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port("127.0.0.1", port, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def stripe_fake():
    from tests.billing_service.stripe_fake import StripeFake

    fake = StripeFake(clock=FakeClock())
    fake.start()
    yield fake
    fake.stop()


class FakeClock:
    """Unix seconds that a test can move forward (`advance`); starts at the real time."""

    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def stripe_api_key() -> str:
    return "sk_test_" + uuid.uuid4().hex


@pytest.fixture
def stripe_env(monkeypatch, stripe_fake, stripe_api_key):
    """The CLI's settings pointed at the strict fake (INFERMETER_STRIPE_API_KEY / _API_BASE)."""
    from infermeter.settings import get_settings

    monkeypatch.setenv("INFERMETER_STRIPE_API_KEY", stripe_api_key)
    monkeypatch.setenv("INFERMETER_STRIPE_API_BASE", stripe_fake.url)
    get_settings.cache_clear()
    return stripe_api_key


class Crash(BaseException):
    """The process 'died' right after a Stripe call (BaseException: no `except Exception` swallows it)."""


class CrashAfter(stripe.HTTPClient):
    """Forwards calls to a real stripe-python HTTP client; after the `after`-th call returns from the server,
    raises Crash instead of giving the answer back. `after=None`: never crashes. `calls` counts them."""

    name = "crash-after"

    def __init__(self, after: int | None = None) -> None:
        super().__init__()
        self.inner = stripe.new_default_http_client()
        self.after = after
        self.calls = 0

    def request(self, method, url, headers, post_data=None, *, _usage=None):
        response = self.inner.request(method, url, headers, post_data)
        self.calls += 1
        if self.after is not None and self.calls == self.after:
            raise Crash(f"crash after call {self.calls}: {method.upper()} {url}")
        return response

    def close(self) -> None:
        self.inner.close()


def client_for(api_key: str, base: str, crash_after: int | None = None) -> tuple[stripe.StripeClient, CrashAfter]:
    http = CrashAfter(crash_after)
    return stripe.StripeClient(api_key, base_addresses={"api": base}, http_client=http, max_network_retries=0), http


@pytest.fixture(scope="session")
def stripe_pg_server(pg_dir: Path) -> str:
    """The session's embedded PostgreSQL (tests/conftest.py's `pg_dir`: the same server `pg_server_url`
    starts or attaches to), without migrating its template."""
    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"]
    return start_embedded_postgres(pg_dir)


@pytest.fixture
def stripe_pg_engine(stripe_pg_server: str):
    from billing_service.stripe.tables import TABLES
    from infermeter.db import metadata

    name = f"t_stripe_{uuid.uuid4().hex[:10]}"
    head, _, query = stripe_pg_server.partition("?")
    url = head.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")
    with psycopg.connect(to_libpq_url(stripe_pg_server), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    engine = create_engine(url)
    metadata.create_all(engine, tables=list(TABLES))
    yield engine
    engine.dispose()
    with contextlib.suppress(Exception), psycopg.connect(to_libpq_url(stripe_pg_server), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def stripe_tools():
    """The helpers of this plugin, for test modules (importing this module from one directly would
    import it before pytest can rewrite its asserts)."""
    import types

    return types.SimpleNamespace(client_for=client_for, Crash=Crash, CrashAfter=CrashAfter)
