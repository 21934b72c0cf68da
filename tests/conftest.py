"""Shared fixtures: the real embedded PostgreSQL and the real Tansu broker, started once per session.

- `pg_server_url`: the server (migrated template database `infermeter_template`).
- `db_url`: a fresh database per test, cloned from the migrated template (fast), SQLAlchemy URL.
- `kafka_bootstrap`: one Tansu broker for the session; use unique topic and group ids per test
  (`unique_name`) because Tansu groups can get stuck after a crash.
- `settings`: Settings pointing at the test database and broker with unique topics.
Missing infrastructure fails the run: nothing here skips.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings

from infermeter.db import upgrade
from infermeter.settings import Settings
from infermeter.stack.broker import start_tansu
from infermeter.stack.postgres import remove_scratch, start_embedded_postgres, to_libpq_url

TEMPLATE_DB = "infermeter_template"

# No Hypothesis deadline: an example's wall time says nothing about correctness (speed is measured by
# bench/), and beside other workers one example of a microsecond test took 322 ms (the default
# deadline is 200 ms). Tests keep their own max_examples.
hypothesis_settings.register_profile("infermeter", deadline=None)
# Under mutmut (it sets MUTANT_UNDER_TEST for each mutant) a property without its own count tries 10
# examples, and those with one a tenth of it (tests/examples.py): the score is a lower bound.
hypothesis_settings.register_profile("mutation", deadline=None, max_examples=10)
hypothesis_settings.load_profile("mutation" if os.environ.get("MUTANT_UNDER_TEST") else "infermeter")

# The tests' usage is pinned to 2026. In-process consumers judge the raw-event retention from a frozen
# instant (tests/metering/conftest.py), but the processes the tests start (`infermeter up`, `events ingest`,
# the serving stack) judge it, and `up` archives by it daily, on the real clock: with the default 13 months,
# those pinned months would be dead-lettered as too_old (or archived and dropped) from 2027-12. The session
# keeps ten years; tests of the retention set or pass their own.
os.environ.setdefault("INFERMETER_RETENTION_MONTHS", "120")


def _with_database(url: str, name: str) -> str:
    head, _, query = url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session", autouse=True)
def scratch_root() -> Path:
    """Every `tempfile.mkdtemp` of the session (embedded PostgreSQL data dirs, CLI homes) lands in
    one short folder that is removed when the session's process exits — after the embedded servers'
    own exit handlers, registered later, have stopped them — so a test run leaves nothing behind."""
    root = Path(tempfile.mkdtemp(prefix="infermeter-tests-"))
    root.chmod(0o755)  # run as root, the embedded server runs as its own user and must get through
    tempfile.tempdir = str(root)
    atexit.register(remove_scratch, root)  # atexit runs last-registered first: this one runs last
    return root


@pytest.fixture(scope="session")
def pg_dir() -> Path:
    root = Path(os.environ.get("INFERMETER_TEST_PGDATA") or tempfile.mkdtemp(prefix="infermeter-test-pg-"))
    return root / "pg"


@pytest.fixture(scope="session")
def pg_server_url(pg_dir: Path) -> str:
    if os.environ.get("DATABASE_URL"):
        server_url = os.environ["DATABASE_URL"]
    else:
        server_url = start_embedded_postgres(pg_dir)
    admin = to_libpq_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    upgrade(_with_database(server_url, TEMPLATE_DB))
    return server_url


def new_database(server_url: str) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(to_libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    return _with_database(server_url, name)


@pytest.fixture
def db_url(pg_server_url: str) -> str:
    return new_database(pg_server_url)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    broker = start_tansu(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    yield broker.bootstrap
    broker.stop()


@pytest.fixture(autouse=True)
def _default_home_outside_the_checkout(monkeypatch, tmp_path) -> None:
    """INFERMETER_HOME for every test: one that builds its Settings (or runs a command) without a
    home of its own would otherwise write credentials.json into the checkout's `.infermeter/`."""
    monkeypatch.setenv("INFERMETER_HOME", str(tmp_path / "default-home"))


@pytest.fixture
def unique_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(db_url: str, kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> Settings:
    return Settings(
        INFERMETER_HOME=tmp_path / "home",
        DATABASE_URL=db_url,
        KAFKA_BOOTSTRAP=kafka_bootstrap,
        INFERMETER_TOPIC_PREFIX=unique_name,
        INFERMETER_CONSUMER_GROUP=f"{unique_name}-group",
        INFERMETER_BATCH_MAX_WAIT_MS=50,
    )


# The fixtures through which a test runs a vLLM engine (tests/serving/conftest.py): the session's
# replicas, or the tiny model and the vLLM interpreter from which a test starts engines of its own.
ENGINE_FIXTURES = frozenset({"vllm_servers", "tiny_model", "vllm_python"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the marks to group by
def pytest_collection_modifyitems(config, items) -> None:
    """Under `--dist loadgroup` every test that runs a vLLM engine (ENGINE_FIXTURES among the fixtures
    it needs, directly or through others) runs on one worker, which alone starts the session's vLLM
    replicas (a CPU engine each: two workers starting their own would starve each other). Every other
    test, in tests/serving/ too, is spread over the workers like the rest of the suite, the long ones
    first."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("vllm"))
    # Long tests (marked `slow`) first. pytest-xdist hands out the groups first (largest first), then
    # every other test one at a time in this order: a long test near the end would run alone while
    # the other workers have nothing left to do (the API fuzz, last by name, held the run's last 80 s).
    # Then the tests that mostly wait (marked `waits`: Tansu holds a consumer group's first member
    # 3 s), so they wait beside busy tests: in file order all the workers waited on them at once,
    # leaving the cores half idle for a minute.
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("waits") is None))


def pytest_collection_finish(session) -> None:
    """A worker of `--dist loadgroup` whose grouped tests did not get their group in their node id
    (what pytest-xdist schedules by) would run them anywhere, each worker starting its own engines:
    refuse to run rather than go on slowly and unnoticed."""
    if not (hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup")):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]
    ]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup: {len(lost)} tests marked xdist_group were not grouped (e.g. {lost[0]}); "
            "this pytest and pytest-xdist do not work together (see pyproject.toml)"
        )
