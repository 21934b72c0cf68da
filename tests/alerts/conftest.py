"""Fixtures for the alerts: a real webhook receiver (aiohttp on loopback, in its own thread) that
verifies each delivery with the Python snippet of docs/alerts.md, and real PostgreSQL with serving's
budgets, spend made through admission (`AdmissionController.admit_sync` / `settle_sync`)."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from aiohttp import web

from alerts.signing import DELIVERY_HEADER, SIGNATURE_HEADER
from infermeter.db import get_engine
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from prediction_service.budgets import ServingBudgets
from serving.budgets import AdmissionController, set_budget

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 20, 10, tzinfo=UTC)
SECRET = "whsec_test_secret_0123456789"
OUTPUT_PER_MTOK = "10000"  # 0.01 per output token: spend in cents is a token count


def docs_receiver() -> dict:
    """The receiver's snippet of docs/alerts.md ("Verifying a delivery"), executed: its `verify` and
    `receive`."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    section = text.split("## Verifying a delivery", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/alerts.md", "exec"), namespace)  # noqa: S102 - the documented snippet itself
    return namespace


@dataclass
class Received:
    delivery_id: str
    signature: str
    body: bytes
    status: int
    answer: str


@dataclass
class Receiver:
    """A webhook endpoint on 127.0.0.1: answers 500 to its first `fail_first` requests, then what the
    documented `receive` answers (400 bad signature, 200 duplicate, 200 processed)."""

    secret: str = SECRET
    fail_first: int = 0
    requests: list[Received] = field(default_factory=list)
    processed: set[str] = field(default_factory=set)
    url: str = ""

    def __post_init__(self) -> None:
        self._receive = docs_receiver()["receive"]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-receiver", daemon=True)
        self._lock = threading.Lock()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        with self._lock:
            if len(self.requests) < self.fail_first:
                status, answer = 500, "failing on purpose"
            else:
                status, answer = self._receive(self.secret, signature, body, self.processed)
            self.requests.append(Received(request.headers.get(DELIVERY_HEADER, ""), signature, body, status, answer))
        return web.Response(status=status, text=answer)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/hooks"

    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def answers(self) -> list[tuple[int, str]]:
        with self._lock:
            return [(r.status, r.answer) for r in self.requests]


@pytest.fixture
def receivers():
    """Start receivers: receivers(fail_first=2); each is stopped after the test."""
    started: list[Receiver] = []

    def start(fail_first: int = 0) -> Receiver:
        started.append(Receiver(fail_first=fail_first).start())
        return started[-1]

    yield start
    for found in started:
        found.stop()


@pytest.fixture
def receiver(receivers) -> Receiver:
    return receivers()


@pytest.fixture
def alert_settings(db_url, tmp_path) -> Settings:
    return Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=db_url, INFERMETER_LIST_PRICE_INPUT_PER_MTOK="0",
                    INFERMETER_LIST_PRICE_CACHED_INPUT_PER_MTOK="0",
                    INFERMETER_LIST_PRICE_OUTPUT_PER_MTOK=OUTPUT_PER_MTOK, INFERMETER_ALERT_RETRY_BASE_S=0.5)


@pytest.fixture
def conn(db_url):
    """An autocommit connection, as the commands and the schedule open them."""
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as connection:
        connection.execute("SET TIME ZONE 'UTC'")
        yield connection


@pytest.fixture
def budgets(db_url, alert_settings):
    with ServingBudgets(db_url, alert_settings) as found:
        yield found


class Spender:
    """Spend as the gateway makes it: admit a request, settle it to its actual output."""

    def __init__(self, db_url: str, settings: Settings) -> None:
        self.engine = get_engine(db_url)
        self.controller = AdmissionController(self.engine, settings)

    def cap(self, customer_id: str, monthly_cap: str) -> None:
        set_budget(self.engine, customer_id, monthly_cap=Decimal(monthly_cap))

    def spend(self, customer_id: str, amount: str, *, at: datetime = NOW) -> None:
        """One request costing exactly `amount` (whole cents), settled at `at`."""
        tokens = int(Decimal(amount) * 100)
        request_id = f"req-{uuid.uuid4().hex[:12]}"
        admitted = self.controller.admit_sync(customer_id, model="m", request_id=request_id, prompt_tokens=0,
                                              max_tokens=tokens, now=at)
        assert admitted.reserved == Decimal(amount), admitted
        self.controller.settle_sync(request_id, input_tokens=0, cached_input_tokens=0, output_tokens=tokens,
                                    event_source="test", event_id=request_id, now=at + timedelta(seconds=1))


@pytest.fixture
def spender(db_url, alert_settings):
    found = Spender(db_url, alert_settings)
    yield found
    found.controller.close()


class FakeClock:
    """The senders' clock, started at the real time (the receiver checks the signature's age against
    its own clock); `sleep` advances it and keeps what it was asked to wait."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)
        self.sleeps: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
