"""One metered database, one uvicorn server (the real API app, pages included) and one Chromium for
the whole module: the data goes through metering's write path (Kafka + the consumer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import uvicorn
from playwright.sync_api import sync_playwright
from sqlalchemy import create_engine

from app.api import create_app
from infermeter.settings import Settings
from infermeter.stack.ports import free_port
from infermeter.stack.postgres import to_libpq_url
from metering.contract import encode_event, replica_event
from serving.keys import KeyStore
from tests.conftest import new_database
from tests.metering.conftest import meter, request_event, task_event

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DAY = datetime(2026, 11, 2, tzinfo=UTC)
WINDOW = {"from": "2026-11-02T00:00:00Z", "to": "2026-11-03T00:00:00Z"}
ROOT = Path(__file__).resolve().parents[2]
SETUP_AT = datetime(2026, 10, 25, tzinfo=UTC)
BILLED_AT = datetime(2026, 12, 3, tzinfo=UTC)  # after November and its grace window: invoices finalize
CREDITED_AT = datetime(2026, 12, 3, 9, 15, 42, 250_000, tzinfo=UTC)  # a credit note, shown to the second
PERIOD = "2026-11"
# The sizes the pages are checked at: a laptop and a phone (as the phone's browser lays it out: mobile, touch).
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}


def _replica(replica: str, deployment: str, customer: str | None, start: datetime, minutes: int, busy_s: int,
             prompt: int, generation: int) -> bytes:
    return encode_event(replica_event(
        source="//test/agent", replica_id=replica, deployment_id=deployment, customer_id=customer, gpu_type="L4",
        gpu_count=1, interval_start=start, interval_end=start + timedelta(minutes=minutes),
        busy_seconds=str(busy_s), prompt_tokens=prompt, generation_tokens=generation))


def stream(recent: datetime) -> list[bytes]:
    """cust-a: m1 over three hours with tasks and retries, m2 in a fourth hour (10 of these requests
    in project proj-1), some recent traffic, a dedicated deployment; cust-b: a different model, numbers and deployment."""
    lines = []
    tasks_a = {0: ("task-a1", 1), 1: ("task-a1", 2), 4: ("task-a2", 1), 6: ("task-a3", 1), 7: ("task-a3", 2),
               8: ("task-a3", 3)}
    for i in range(12):
        task, attempt = tasks_a.get(i, (None, 1))
        lines.append(request_event(i, customer="cust-a", model="m1", at=DAY + timedelta(hours=10, minutes=15 * i),
                                   input_tokens=1000 + i, cached=400, output=50 + i, task_id=task, attempt=attempt,
                                   project="proj-1" if i >= 8 else None))
    for i in range(12, 18):  # made with the key of project proj-1 (the first 8 above with a key without one)
        lines.append(request_event(i, customer="cust-a", model="m2", at=DAY + timedelta(hours=13, minutes=i),
                                   input_tokens=500, cached=0, output=20, project="proj-1"))
    for i in range(18, 23):
        lines.append(request_event(i, customer="cust-a", model="m1", at=recent + timedelta(minutes=i),
                                   input_tokens=300, cached=100, output=30))
    for i in range(100, 107):
        lines.append(request_event(i, customer="cust-b", model="m3", at=DAY + timedelta(hours=10, minutes=i - 100),
                                   input_tokens=2000, cached=1500, output=999, task_id="task-b1"))
    lines += [task_event("task-a1", "cust-a", "succeeded", DAY + timedelta(hours=13, minutes=30)),
              task_event("task-a2", "cust-a", "failed", DAY + timedelta(hours=13, minutes=31)),
              task_event("task-a3", "cust-a", "succeeded", DAY + timedelta(hours=13, minutes=32)),
              task_event("task-b1", "cust-b", "succeeded", DAY + timedelta(hours=11))]
    lines += [_replica("ded-a-0", "ded-a", "cust-a", DAY + timedelta(hours=10), 30, 900, 10_000, 2_000),
              _replica("ded-a-0", "ded-a", "cust-a", DAY + timedelta(hours=11), 30, 1200, 12_000, 3_000),
              _replica("ded-b-0", "ded-b", "cust-b", DAY + timedelta(hours=10), 60, 3000, 40_000, 9_000),
              _replica("pool-0", "shared-1", None, DAY + timedelta(hours=10), 60, 1800, 20_000, 5_000)]
    return lines


@dataclass
class Site:
    url: str
    settings: Settings
    keys: dict[str, str]
    store: KeyStore
    app: object


@contextmanager
def served(app) -> Iterator[str]:
    """`app` (an ASGI app) served by uvicorn on a free loopback port in a thread, its lifespan run:
    its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="package")
def site(pg_server_url, kafka_bootstrap, tmp_path_factory) -> Site:
    name = f"dash{int(time.time() * 1000) % 10**8}"
    settings = Settings(
        INFERMETER_HOME=tmp_path_factory.mktemp("dash-home"), DATABASE_URL=new_database(pg_server_url),
        KAFKA_BOOTSTRAP=kafka_bootstrap, INFERMETER_TOPIC_PREFIX=name, INFERMETER_CONSUMER_GROUP=f"{name}-group",
        INFERMETER_BATCH_MAX_WAIT_MS=50, INFERMETER_SESSION_TTL_S=600,
        # the package's tests sign in wrongly and present revoked keys from one address, far more than
        # the backoff allows; test_backoff.py serves an app of its own with the default allowance
        INFERMETER_AUTH_FAILURES_ALLOWED=10_000,
    )
    recent = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    counts = meter(settings, stream(recent), raw=[b"this is not json", b'{"specversion": "1.0"}'])
    assert counts.rejected == 2 and counts.accepted == 12 + 6 + 5 + 7 + 4 + 4, counts
    store = KeyStore(create_engine(settings.database_url), settings=settings, cache_ttl_s=0)
    revoked_id, revoked = store.create("cust-a")
    store.revoke(revoked_id)
    keys = {"a": store.create("cust-a", project_id="proj-1")[1], "b": store.create("cust-b")[1],
            "revoked": revoked, "admin": settings.admin_token}
    app = create_app(settings, settings.database_url, None, keys=store)  # no key cache: revocation is seen at once
    with served(app) as url:
        yield Site(url, settings, keys, store, app)


@pytest.fixture(scope="package")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A fresh browser context and page that records console errors, page errors and any request
    that leaves the site (nothing may load from a CDN)."""

    def __init__(self, browser, site: Site, viewport: dict | None = None):
        self.site = site
        self.viewport = viewport or {"width": 1280, "height": 900}
        phone = self.viewport["width"] < 600
        self.context = browser.new_context(viewport=self.viewport, is_mobile=phone, has_touch=phone)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: None if r.url.startswith((site.url, "data:", "blob:", "about:"))
                     else self.problems.append(f"network: {r.url}"))

    def goto(self, path: str):
        return self.page.goto(self.site.url + path)

    def sign_in(self, key: str) -> None:
        self.goto("/signin")
        self.page.fill("input[name=api_key]", key)
        with self.page.expect_navigation():
            self.page.click("section.signin button[type=submit]")

    def admin_sign_in(self, token: str) -> None:
        self.goto("/admin/signin")
        self.page.fill("input[name=admin_token]", token)
        with self.page.expect_navigation():
            self.page.click("section.signin button[type=submit]")

    def wait_for_charts(self, count: int) -> None:
        self.page.wait_for_selector(f"body[data-charts-drawn='{count}']", state="attached", timeout=20000)

    def chart_data(self, chart: str) -> list[dict]:
        """What plotly drew: each trace's name, x and y (from the plot's own state)."""
        return self.page.evaluate(
            "id => document.getElementById(id).data.map(t => ({name: t.name, x: t.x, y: t.y}))", f"chart-{chart}")

    def svg_points(self, chart: str, selector: str = ".point") -> int:
        return self.page.eval_on_selector_all(f"#chart-{chart} .main-svg {selector}", "els => els.length")

    def text(self, testid: str) -> str:
        return self.page.inner_text(f"[data-testid={testid}]")

    def close(self) -> None:
        self.context.close()


@pytest.fixture(params=list(VIEWPORTS))
def viewport(request) -> dict:
    """Each size of VIEWPORTS in turn (a test that takes it runs once per size)."""
    return VIEWPORTS[request.param]


@pytest.fixture
def web(browser, site):
    """Opens a Page on the site (or on another Site given), at a viewport's size (default 1280x900)."""
    pages: list[Page] = []

    def open_page(on: Site | None = None, viewport: dict | None = None) -> Page:
        pages.append(Page(browser, on or site, viewport))
        return pages[-1]

    yield open_page
    for p in pages:
        p.close()


def infermeter(site, *args: str) -> dict:
    """The real CLI on the site's database, its --json output."""
    env = {**os.environ, "DATABASE_URL": site.settings.database_url, "INFERMETER_HOME": str(site.settings.home)}
    env.pop("KAFKA_BOOTSTRAP", None)
    done = subprocess.run([sys.executable, "-m", "app.cli", *args, "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="package")
def billed(site) -> dict:
    """cust-a and cust-b billed for November on the per-token book (cust-b with 0.05 USD of prepaid
    credit); cust-a's first invoice voided and reissued, then paid, then credited on its first line
    (CREDITED_AT); cust-a has a monthly budget."""
    from billing_service.credits import grant_credits, issue_credit_note
    from billing_service.customers import assign_plan, set_customer
    from billing_service.invoices import list_invoices, record_payment_status, show_invoice, void_invoice
    from billing_service.run import billing_run
    from pricing_service.books import EXAMPLE_BOOKS_DIR
    from serving.budgets import set_budget

    book = EXAMPLE_BOOKS_DIR / "per-token.yaml"
    with psycopg.connect(to_libpq_url(site.settings.database_url)) as conn:
        for customer in ("cust-a", "cust-b"):
            set_customer(conn, customer, now=SETUP_AT, name=customer.upper())
            assign_plan(conn, customer, book.read_text(), str(book), "2026-11-01", now=SETUP_AT)
        grant_credits(conn, "cust-b", "0.05", now=SETUP_AT, reason="prepaid top-up")
        conn.commit()
        billing_run(conn, PERIOD, now=BILLED_AT)
        conn.commit()
        [first] = list_invoices(conn, customer_id="cust-a", period=PERIOD)
        void_invoice(conn, first["id"], now=BILLED_AT)
        conn.commit()
        billing_run(conn, PERIOD, now=BILLED_AT)
        conn.commit()
        reissued = [i for i in list_invoices(conn, customer_id="cust-a", period=PERIOD) if i["status"] == "open"][0]
        record_payment_status(conn, reissued["id"], "paid", BILLED_AT, now=BILLED_AT)
        conn.commit()
        first_line = show_invoice(conn, reissued["id"])["lines"][0]["id"]
        issue_credit_note(conn, reissued["id"], reason="goodwill", now=CREDITED_AT, line_ids=[first_line])
        conn.commit()
        invoices = {c: list_invoices(conn, customer_id=c) for c in ("cust-a", "cust-b")}
    set_budget(create_engine(site.settings.database_url), "cust-a", monthly_cap=Decimal("50.00"), mode="soft")
    return invoices
