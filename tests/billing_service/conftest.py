"""Fixtures for billing_service: the real embedded PostgreSQL (`db_url`), usage written through
metering's real write path (BatchWriter: raw events and rollups agree), a frozen clock, price books."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url
from metering.contract import REPLICA_V1, REQUEST_V1, TASK_V1, USAGE_V1, encode_event, make_event
from metering.kafka_types import Message
from metering.writer import BatchWriter
from tests.cli_in_process import CliResult, run_cli

WRITER_NOW = datetime(2030, 1, 1, tzinfo=UTC)  # metering's clock: every test event is in its past

BOOK_YAML = """\
id: bill-usd
currency: USD
charges:
  - meter: uncached_input_tokens
    price: {type: unit, amount: "2.00", per: 1000000}
  - meter: cached_input_tokens
    price: {type: unit, amount: "1.00", per: 1000000}
  - meter: output_tokens
    price: {type: unit, amount: "8.00", per: 1000000}
  - meter: output_tokens
    model: big
    price: {type: unit, amount: "24.00", per: 1000000}
  - meter: successful_tasks
    price: {type: unit, amount: "0.05", per: 1}
  - meter: "usage:tool_calls"
    price: {type: unit, amount: "0.003", per: 1}
"""
# what the reference computations below price by: (meter, model or None) -> (amount, per)
PRICES = {
    ("uncached_input_tokens", None): (Decimal("2.00"), 1_000_000),
    ("cached_input_tokens", None): (Decimal("1.00"), 1_000_000),
    ("output_tokens", None): (Decimal("8.00"), 1_000_000),
    ("output_tokens", "big"): (Decimal("24.00"), 1_000_000),
    ("successful_tasks", None): (Decimal("0.05"), 1),
    ("usage:tool_calls", None): (Decimal("0.003"), 1),
}
EUR_BOOK_YAML = BOOK_YAML.replace("id: bill-usd", "id: bill-eur").replace("currency: USD", "currency: EUR")
GPU_BOOK_YAML = BOOK_YAML.replace("id: bill-usd", "id: bill-gpu") + """\
  - meter: gpu_seconds
    price: {type: unit, amount: "3.60", per: 3600}
"""


@pytest.fixture
def book_file(tmp_path: Path) -> Path:
    path = tmp_path / "bill-usd.yaml"
    path.write_text(BOOK_YAML)
    return path


@pytest.fixture
def conn(db_url: str):
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as c:
        c.execute("SET TIME ZONE 'UTC'")
        yield c


@dataclass
class Sent:
    kind: str
    customer: str
    at: datetime
    data: dict = field(default_factory=dict)


class Metering:
    """Writes events through metering's BatchWriter and keeps the list sent (the test's reference)."""

    def __init__(self, db_url: str):
        self.writer = BatchWriter(to_libpq_url(db_url), group_id="billing-tests", max_bytes=65536,
                                  future_tolerance_s=300, clock=lambda: WRITER_NOW)
        self.offsets = itertools.count()
        self.ids = itertools.count(1)
        self.sent: list[Sent] = []

    def _write(self, events: list[dict]) -> None:
        messages = [Message("events", 0, next(self.offsets), None, encode_event(e), {}, None) for e in events]
        result = self.writer.write(messages)
        assert result.accepted == len(events), result

    def request(self, customer: str, at: datetime, *, model: str = "m1", input_tokens: int = 1000, cached: int = 0,
                output: int = 100, task_id: str | None = None, attempt: int = 1, project: str | None = None) -> None:
        """A request; `project` (the API key's) changes no invoice: the reference ignores it."""
        i = next(self.ids)
        data = {"request_id": f"r-{i}", "customer_id": customer, "model": model, "deployment_id": "d1", "status": "ok",
                "input_tokens": input_tokens, "cached_input_tokens": cached, "output_tokens": output,
                "task_id": task_id, "attempt": attempt, "started_at": at, "finished_at": at}
        if project is not None:
            data["project"] = project
        self._write([make_event(REQUEST_V1, source="//test/gw", subject=customer, event_id=f"r-{i}", time=at, data=data)])
        self.sent.append(Sent("request", customer, at, {"model": model, "input": input_tokens, "cached": cached,
                                                        "output": output}))

    def task(self, customer: str, task_id: str, outcome: str, at: datetime, *, source: str = "//test/agents",
             event_id: str | None = None) -> None:
        self._write([make_event(TASK_V1, source=source, subject=customer, event_id=event_id or f"{task_id}/{outcome}",
                                time=at, data={"task_id": task_id, "customer_id": customer, "outcome": outcome,
                                               "finished_at": at})])
        self.sent.append(Sent("task", customer, at, {"outcome": outcome}))

    def usage(self, customer: str, meter: str, quantity: str, at: datetime) -> None:
        i = next(self.ids)
        self._write([make_event(USAGE_V1, source="//test/tools", subject=customer, event_id=f"u-{i}", time=at,
                                data={"customer_id": customer, "meter": meter, "quantity": quantity})])
        self.sent.append(Sent("usage", customer, at, {"meter": meter, "quantity": Decimal(quantity)}))

    def replica(self, customer: str | None, start: datetime, end: datetime, *, gpus: int = 1,
                deployment: str = "dedicated-1", replica: str = "rep-1") -> None:
        self._write([make_event(REPLICA_V1, source="//test/agent", subject=customer or "shared-pool",
                                event_id=f"{replica}/{start.isoformat()}", time=end, data={
                                    "replica_id": replica, "deployment_id": deployment, "customer_id": customer,
                                    "gpu_type": "H100", "gpu_count": gpus, "interval_start": start,
                                    "interval_end": end, "busy_seconds": "0", "prompt_tokens": 0,
                                    "generation_tokens": 0})])

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
def metering(db_url: str):
    m = Metering(db_url)
    yield m
    m.close()


def reference_amounts(sent: list[Sent], customer: str, start: datetime, end: datetime) -> dict[tuple[str, str], Decimal]:
    """Independent of the code under test: quantities of the events in [start, end), from the list of
    events sent, priced by PRICES and rounded half-up to cents per (meter, model) line."""
    q: dict[tuple[str, str], Decimal] = {}

    def add(meter: str, model: str, quantity) -> None:
        if quantity:
            q[(meter, model)] = q.get((meter, model), Decimal(0)) + Decimal(quantity)

    for s in sent:
        if s.customer != customer or not start <= s.at < end:
            continue
        if s.kind == "request":
            add("uncached_input_tokens", s.data["model"], s.data["input"] - s.data["cached"])
            add("cached_input_tokens", s.data["model"], s.data["cached"])
            add("output_tokens", s.data["model"], s.data["output"])
        elif s.kind == "task" and s.data["outcome"] == "succeeded":
            add("successful_tasks", "", 1)
        elif s.kind == "usage":
            add("usage:" + s.data["meter"], "", s.data["quantity"])
    out = {}
    for (meter, model), quantity in q.items():
        amount, per = PRICES.get((meter, model)) or PRICES[(meter, None)]
        out[(meter, model)] = (quantity * amount / per).quantize(Decimal("0.01"), ROUND_HALF_UP)
    return out


def reference_total(sent: list[Sent], customer: str, start: datetime, end: datetime) -> Decimal:
    return sum(reference_amounts(sent, customer, start, end).values(), Decimal(0))


# ---------------------------------------------------------------- a finalized February, the CLI, the API

FEB_START, MAR_START = datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)
AFTER_GRACE = datetime(2026, 3, 2, 1, tzinfo=UTC)


def cost_model():
    from pricing_service.books import read_cost_model

    return read_cost_model(None)


@pytest.fixture
def february(conn, metering):
    """Customer acme (UTC, USD, anchor 1) on bill-usd from 2026-02-01, with February usage, finalized."""
    from billing_service.customers import assign_plan, set_customer
    from billing_service.run import billing_run

    t0 = datetime(2026, 1, 20, tzinfo=UTC)
    set_customer(conn, "acme", now=t0)
    assign_plan(conn, "acme", BOOK_YAML, "bill-usd.yaml", "2026-02-01", now=t0)
    metering.request("acme", datetime(2026, 2, 3, 10, tzinfo=UTC), input_tokens=1_000_000, cached=250_000,
                     output=100_000, project="web")
    metering.request("acme", datetime(2026, 2, 10, 10, tzinfo=UTC), model="big", input_tokens=20_000, output=50_000)
    metering.usage("acme", "tool_calls", "40", datetime(2026, 2, 11, tzinfo=UTC))
    [inv] = billing_run(conn, "2026-02", now=AFTER_GRACE, cost_model=cost_model()).invoices
    assert inv.status == "open"
    return inv


@pytest.fixture
def cli(db_url, monkeypatch, capsys, tmp_path):
    """`infermeter ...` through app.cli.main (errors as one line, exit codes), on the test database and a
    frozen clock: cli("billing", "run", ..., now=datetime)."""

    from billing_service.cli import CLOCK
    from infermeter.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    state = {"now": AFTER_GRACE}
    frozen = CLOCK.set(lambda: state["now"])

    def invoke(*args: str, now: datetime | None = None) -> CliResult:
        if now is not None:
            state["now"] = now
        return run_cli(monkeypatch, capsys, *args)

    yield invoke
    CLOCK.reset(frozen)
    get_settings.cache_clear()


@pytest.fixture
def api(db_url, tmp_path):
    """The HTTP app (no broker) with a customer key for acme and one for other; frozen clock."""
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine

    from app.api import create_app
    from infermeter.settings import Settings
    from serving.keys import KeyStore

    settings = Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=db_url)
    store = KeyStore(create_engine(db_url), settings=settings)
    _, key_acme = store.create("acme")
    _, key_other = store.create("other")
    app = create_app(settings, db_url, None, clock=lambda: AFTER_GRACE)
    with TestClient(app) as client:
        yield client, {"acme": key_acme, "other": key_other, "admin": settings.admin_token,
                       "producer": settings.producer_token}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def table_counts(conn) -> dict[str, object]:
    """Every billing table's rows, for 'nothing was written' checks."""
    out = {}
    for table in ("billing_customers", "billing_price_books", "billing_plans", "billing_invoices",
                  "billing_invoice_lines", "billing_invoice_lines_replaced", "billing_invoice_history",
                  "billing_number_counters", "billing_credit_grants", "billing_credit_ledger", "billing_credit_notes"):
        out[table] = sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
    return out
