"""schemathesis over the API app's whole OpenAPI document (app.api.create_app: metering, pricing,
billing, the Stripe webhook, capacity and the dashboards' data endpoints), in-process over ASGI,
against the real embedded PostgreSQL with data in it: a customer with keys, usage, tasks and a GPU
deployment written through metering's write path, a stored price book, billing customers with a
plan, a finalized invoice and credit.

Each operation is fuzzed twice, with a customer API key and with the admin token; every phase
(schema examples, coverage, fuzzing) and both generation modes (valid and invalid input) run. The
checks: no 5xx, the status code is one the operation declares, and the content type, the headers
and the body match what it declares for that status. An admin-only operation called with a
customer key never answers data (input it cannot parse is refused before the rights are checked);
`test_customer_key_refused_on_admin_operations` checks the 403 itself on each.

Not in the document, so not fuzzed: the dashboards' HTML pages, their sign-in/sign-out and
book-upload forms (CSRF-protected form posts) and static files. The Stripe webhook is in it and
fuzzed; without a valid Stripe-Signature every generated request is refused (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import create_engine

from app.api import create_app
from infermeter.settings import Settings
from infermeter.stack import to_libpq_url
from serving.keys import KeyStore
from tests.billing_service.conftest import BOOK_YAML, Metering
from tests.conftest import new_database

ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"
PRODUCER_TOKEN = "fuzz-producer-token-0123456789abcdef"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
# Each operation runs its schema examples, the coverage phase's cases and up to this many fuzzed
# cases, valid and invalid: the module takes ~2 min on this 2-core machine under other load (2026-12-01).
# derandomize: the same cases every run (a failure in CI reproduces here); no timing (deadline=None)
FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
DAY = datetime(2026, 11, 2, tzinfo=UTC)
AFTER_GRACE = datetime(2026, 12, 5, tzinfo=UTC)


@dataclass
class Api:
    app: object
    customer_key: str
    settings: Settings


def _seed(db_url: str) -> None:
    """Usage, tasks and a dedicated GPU deployment in November for two customers; a stored price
    book; both customers billed for November on it (finalized), one with prepaid credit."""
    from billing_service.credits import grant_credits
    from billing_service.customers import assign_plan, set_customer
    from billing_service.run import billing_run
    from pricing_service.books import import_book, read_cost_model

    metering = Metering(db_url)
    try:
        for i in range(12):
            task = f"task-{i % 3}" if i < 6 else None
            metering.request("cust-a", DAY + timedelta(hours=10, minutes=5 * i), input_tokens=1000 + i, cached=400,
                             output=50 + i, task_id=task, attempt=1 + i // 3 if task else 1)
            metering.request("cust-b", DAY + timedelta(hours=11, minutes=5 * i), model="m2", input_tokens=2000,
                             cached=0, output=99)
        metering.task("cust-a", "task-0", "succeeded", DAY + timedelta(hours=12))
        metering.task("cust-a", "task-1", "failed", DAY + timedelta(hours=12))
        metering.usage("cust-a", "tool_calls", "7", DAY + timedelta(hours=12))
        metering.replica("cust-a", DAY + timedelta(hours=10), DAY + timedelta(hours=11), deployment="ded-a")
        metering.replica(None, DAY + timedelta(hours=10), DAY + timedelta(hours=11), deployment="shared-1",
                         replica="pool-0")
    finally:
        metering.close()
    t0 = datetime(2026, 10, 20, tzinfo=UTC)
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        for customer in ("cust-a", "cust-b"):
            set_customer(conn, customer, now=t0)
            assign_plan(conn, customer, BOOK_YAML, "bill-usd.yaml", "2026-11-01", now=t0)
        grant_credits(conn, "cust-b", "5.00", now=t0)
        billing_run(conn, "2026-11", now=AFTER_GRACE, cost_model=read_cost_model(None))
        from pathlib import Path

        import_book(conn, Path(__file__).resolve().parents[1] / "pricing_books" / "per-token.yaml", t0)


@pytest.fixture(scope="module")
def seeded_db(pg_server_url: str) -> str:
    db_url = new_database(pg_server_url)
    _seed(db_url)
    return db_url


@pytest.fixture
def api(seeded_db: str, kafka_bootstrap: str, unique_name: str, tmp_path) -> Api:
    """The app, one per test: schemathesis runs its lifespan and ends it (closing its pool and its
    event publisher) at the end of the test that started it. Events accepted by POST /v1/events go
    to the real broker (topics of their own)."""
    settings_ = Settings(
        INFERMETER_HOME=tmp_path / "home", DATABASE_URL=seeded_db, KAFKA_BOOTSTRAP=kafka_bootstrap,
        INFERMETER_TOPIC_PREFIX=unique_name, INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
        INFERMETER_PRODUCER_TOKEN=PRODUCER_TOKEN, INFERMETER_STRIPE_WEBHOOK_SECRET="whsec_fuzz",
    )
    app = create_app(settings_, seeded_db, kafka_bootstrap)
    store = KeyStore(create_engine(seeded_db), settings=settings_)
    app.state.keys = store
    _, key = store.create("cust-a", project_id="proj-1")
    yield Api(app, key, settings_)
    app.state.pool.close()
    if app.state.publisher is not None:
        app.state.publisher.close()


@pytest.fixture
def api_schema(api: Api, request):
    # schemathesis 4.32's lazy loader reads and renames `node._nodeid` (to name each operation in
    # the report), an attribute pytest 9.2 no longer has; giving it one changes nothing else.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    return schemathesis.openapi.from_asgi("/openapi.json", api.app)


schema = schemathesis.pytest.from_fixture("api_schema")


ADMIN_ONLY = {
    "GET /v1/dead-letters",
    "PUT /v1/billing/customers/{customer_id}",
    "GET /v1/billing/customers/{customer_id}",
    "POST /v1/billing/customers/{customer_id}/plans",
    "POST /v1/billing/runs",
    "POST /v1/billing/invoices/{invoice_id}/void",
    "POST /v1/billing/invoices/{invoice_id}/credit-notes",
    "POST /v1/billing/customers/{customer_id}/credits",
    "GET /v1/billing/exports/{kind}",
    "GET /v1/deployments/{deployment_id}/capacity",
    "GET /admin/pricing/data/{name}",
    "GET /admin/ops/data/{name}",
}


@schema.parametrize()
@FUZZ
def test_openapi_as_customer(case, api: Api) -> None:
    response = case.call_and_validate(headers={"Authorization": f"Bearer {api.customer_key}"}, checks=CHECKS)
    if case.operation.label in ADMIN_ONLY:
        # never data (test_customer_key_refused_on_admin_operations checks the 403 itself): input that
        # cannot be parsed or an unknown chart is answered before the credentials' rights are
        assert not 200 <= response.status_code < 300, (case.operation.label, response.status_code, response.text)


@schema.parametrize()
@FUZZ
def test_openapi_as_admin(case, api: Api) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, checks=CHECKS)


def _admin_requests(invoice_id: str) -> list[tuple[str, str, dict | None]]:
    """One well-formed request for each admin-only operation (method, URL, JSON body)."""
    return [
        ("GET", "/v1/dead-letters", None),
        ("PUT", "/v1/billing/customers/cust-a", {"name": "Changed"}),
        ("GET", "/v1/billing/customers/cust-a", None),
        ("POST", "/v1/billing/customers/cust-a/plans", {"price_book": BOOK_YAML, "from": "2027-01-01"}),
        ("POST", "/v1/billing/runs", {"period": "2026-11"}),
        ("POST", f"/v1/billing/invoices/{invoice_id}/void", None),
        ("POST", f"/v1/billing/invoices/{invoice_id}/credit-notes", {"reason": "goodwill"}),
        ("POST", "/v1/billing/customers/cust-a/credits", {"amount": "100.00"}),
        ("GET", "/v1/billing/exports/invoices?period=2026-11", None),
        ("GET", "/v1/deployments/d1/capacity?at=2026-11-02T11:00:00Z", None),
        ("GET", "/admin/pricing/data/overview.json?from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z", None),
        ("GET", "/admin/ops/data/ingest.json", None),
    ]


def test_customer_key_refused_on_admin_operations(api: Api, api_schema) -> None:
    """A customer key gets 403 (no credentials 401) on every admin-only operation, and changes nothing."""
    from starlette.testclient import TestClient

    labels = {op.label for op in (result.ok() for result in api_schema.get_all_operations())}
    assert ADMIN_ONLY <= labels, ADMIN_ONLY - labels
    client = TestClient(api.app)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    customer = {"Authorization": f"Bearer {api.customer_key}"}
    [invoice] = client.get("/v1/billing/invoices", params={"customer_id": "cust-a"}, headers=admin).json()["invoices"]
    before = client.get(f"/v1/billing/invoices/{invoice['id']}", headers=admin).json()
    credits_before = client.get("/v1/billing/customers/cust-a/credits", headers=admin).json()
    requests = _admin_requests(invoice["id"])
    assert len(requests) == len(ADMIN_ONLY)
    for method, url, body in requests:
        refused = client.request(method, url, json=body, headers=customer)
        assert refused.status_code == 403, (method, url, refused.status_code, refused.text)
        assert refused.json()["error"]["code"] == "forbidden", refused.text
        anonymous = client.request(method, url, json=body)
        assert anonymous.status_code == 401, (method, url, anonymous.status_code, anonymous.text)
    assert client.get(f"/v1/billing/invoices/{invoice['id']}", headers=admin).json() == before
    assert client.get("/v1/billing/customers/cust-a/credits", headers=admin).json() == credits_before
    assert client.get("/v1/billing/customers/cust-a", headers=admin).json()["name"] != "Changed"
    # the same requests with the admin token are not refused (the list above reaches each operation)
    for method, url, body in requests[:3] + requests[8:]:
        assert client.request(method, url, json=body, headers=admin).status_code == 200, (method, url)


def test_dashboards_app_refuses_a_nul_in_a_filter(seeded_db: str, tmp_path) -> None:
    """The pages-only app (`infermeter serve dashboards`) answers a value the database cannot take
    as the API app does (found on the API app by schemathesis: it was a 500)."""
    from starlette.testclient import TestClient

    from dashboards.web.app import create_dashboard_app

    settings_ = Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=seeded_db, INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
                         INFERMETER_PRODUCER_TOKEN=PRODUCER_TOKEN)
    app = create_dashboard_app(settings_, seeded_db, KeyStore(create_engine(seeded_db), settings=settings_))
    try:
        answer = TestClient(app).get("/dashboard/data/tokens.json", params={"customer_id": "cust\x00a"},
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_input"
        # with the lifespan the chart endpoints read in the event loop (the async read pool): the same answer
        with TestClient(app) as client:
            assert app.state.dashboards_read_pool is not None
            for chart in ("tokens", "gpu", "tasks"):
                answer = client.get(f"/dashboard/data/{chart}.json", params={"customer_id": "cust\x00a"},
                                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert answer.status_code == 400, (chart, answer.text)
                assert answer.json()["error"]["code"] == "invalid_input"
    finally:
        app.state.pool.close()
