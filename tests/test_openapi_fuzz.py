"""schemathesis over the API app's whole OpenAPI document (app.api.create_app: metering, pricing,
billing, the Stripe webhook, capacity and the dashboards' data endpoints), in-process over ASGI,
against the real embedded PostgreSQL with data in it: a customer with keys, usage, tasks and a GPU
deployment written through metering's write path, a stored price book, billing customers with a
plan, a finalized invoice and credit.

Each operation is fuzzed twice, with a customer API key and with the admin token; every phase
(schema examples, coverage, fuzzing) and both generation modes (valid and invalid input) run, with
every check schemathesis has (`--checks all`): no 5xx; status, content type, headers and body as
declared; schema-valid input accepted and schema-violating input refused; `Allow` on a 405 naming
the methods the document declares; credentials not ignored; other methods refused. Where a rule goes
beyond what a schema can state (BEYOND_THE_SCHEMA, ADMIN_NAMES_THE_CUSTOMER) a schema-valid request
may get a 400 with the reason instead. An admin-only operation of the API called with a customer
key answers 403 whatever the input (the credentials' rights are checked first);
`test_customer_key_refused_on_admin_operations` checks it on each and that nothing changes.

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
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy import create_engine

from app.api import create_app
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from serving.keys import KeyStore
from tests.billing_service.conftest import BOOK_YAML, Metering
from tests.conftest import new_database

ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"
PRODUCER_TOKEN = "fuzz-producer-token-0123456789abcdef"
load_all_checks()
ALL_CHECKS = CHECKS.get_all()  # `--checks all`
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
    to the real broker (topics of their own). Its negative cases send hundreds of wrong credentials
    from one client address: the backoff on failed authentication is raised out of their way here
    (tests/dashboards/test_backoff.py tests it)."""
    settings_ = Settings(
        INFERMETER_HOME=tmp_path / "home", DATABASE_URL=seeded_db, KAFKA_BOOTSTRAP=kafka_bootstrap,
        INFERMETER_TOPIC_PREFIX=unique_name, INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
        INFERMETER_PRODUCER_TOKEN=PRODUCER_TOKEN, INFERMETER_STRIPE_WEBHOOK_SECRET="whsec_fuzz",
        INFERMETER_AUTH_FAILURES_ALLOWED=1_000_000,
    )
    store = KeyStore(create_engine(seeded_db), settings=settings_)
    app = create_app(settings_, seeded_db, kafka_bootstrap, keys=store)
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
    loaded = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    # 413 (a batch over the declared maxItems) is a refusal too
    checks = loaded.config.checks
    checks.negative_data_rejection = type(checks.negative_data_rejection)(
        expected_statuses=[*checks.negative_data_rejection.expected_statuses, "413"])
    return loaded


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


def _credentials(case, token: str) -> dict[str, str]:
    """The bearer header, unless the case's headers are the invalid part (Authorization left out or
    malformed on purpose: replacing it would make the request valid and the check wrong)."""
    headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta is not None else None
    if headers is not None and headers.mode.is_negative:
        return {}  # the case's own headers: Authorization left out or malformed (401)
    return {"Authorization": f"Bearer {token}"}


# Rules no JSON schema can state, on values the document declares (its descriptions state them): a
# schema-valid request may break one and get 400 with the service's reason. On these operations
# schemathesis's "schema-valid input is accepted" is replaced by: accepted, or refused with a 400
# (the other checks run as everywhere: status declared, body in the error shape).
BEYOND_THE_SCHEMA = {
    "POST /v1/events": "each CloudEvent is checked against its type's schema (metering/schemas)",
    "GET /v1/usage": "`to` after `from`",
    "GET /v1/invoices/preview": "the customer has a plan for the period",
    "PUT /v1/billing/customers/{customer_id}": "an IANA time zone",
    "POST /v1/billing/customers/{customer_id}/plans": "a price book (YAML text)",
    "POST /v1/billing/customers/{customer_id}/credits": "`expires` in the future",
    "PUT /v1/customers/{customer_id}/residency": "regions among INFERMETER_REGIONS",
    "POST /v1/stripe/webhook": "a Stripe-Signature (an HMAC of the body) that cannot be generated",
    "GET /dashboard/data/{name}": "`to` after `from`, at most 400 days apart",
    "GET /admin/pricing/data/{name}": "`to` after `from`, at most 400 days apart",
    "GET /admin/ops/data/{name}": "`to` after `from`, at most 400 days apart",
}
# With the admin token, `customer_id` names the customer on operations a customer key answers for
# itself (each operation's description says so): without it, 400.
ADMIN_NAMES_THE_CUSTOMER = {"GET /v1/tasks", "GET /v1/tasks/{task_id}", "GET /v1/invoices/preview",
                            "GET /dashboard/data/{name}", "POST /v1/quotes"}
ACCEPTED_OR_400 = {*range(200, 400), 400, 401, 403, 404, 409}


def _holds_nul(case) -> bool:
    """A NUL character anywhere in the request: PostgreSQL text cannot hold it, so any operation may
    answer 400 `invalid_input` (docs/metering.md, "Errors and the OpenAPI document")."""
    def holds(value: object) -> bool:
        if isinstance(value, str):
            return "\x00" in value
        if isinstance(value, dict):
            return any(holds(k) or holds(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return any(holds(v) for v in value)
        return False

    return holds([case.path_parameters, case.query, case.headers, case.body])


def _names_customer(case) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    return "customer_id" in (case.query or {}) or "customer_id" in body


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_openapi_as_customer(case, api: Api) -> None:
    response = _call_and_validate(case, api.customer_key, beyond_the_schema=case.operation.label in BEYOND_THE_SCHEMA)
    if case.operation.label in ADMIN_ONLY:
        # never data; the API's admin operations check the rights before the input (403 whatever it
        # holds); the admin charts answer an unknown chart's name before (404)
        assert not 200 <= response.status_code < 300, (case.operation.label, response.status_code, response.text)
        if (not case.operation.label.startswith("GET /admin/")
                and response.request.headers.get("Authorization") == f"Bearer {api.customer_key}"
                and case.method.upper() == case.operation.method.upper()):
            assert response.status_code == 403, (case.operation.label, response.status_code, response.text)


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_openapi_as_admin(case, api: Api) -> None:
    label = case.operation.label
    unnamed = label in ADMIN_NAMES_THE_CUSTOMER and not _names_customer(case)
    _call_and_validate(case, ADMIN_TOKEN, beyond_the_schema=unnamed or label in BEYOND_THE_SCHEMA)


def _call_and_validate(case, token: str, *, beyond_the_schema: bool):
    """Every check (`--checks all`); on an operation whose rules go beyond its schema, a schema-valid
    request may be refused with 400 instead of being accepted (BEYOND_THE_SCHEMA)."""
    relaxed = (beyond_the_schema or _holds_nul(case)) and case.method.upper() == case.operation.method.upper()
    response = case.call_and_validate(headers=_credentials(case, token), checks=ALL_CHECKS,
                                      excluded_checks=[positive_data_acceptance] if relaxed else None)
    if relaxed and case.meta is not None and not case.meta.generation.mode.is_negative:
        assert response.status_code in ACCEPTED_OR_400, (case.operation.label, response.status_code, response.text)
    return response


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


# Requests FastAPI would refuse before reading the credentials' rights: a body that is not JSON, JSON
# of the wrong form, query parameters of the wrong type (admin-only operations, customer key: 403).
MALFORMED = [
    ("PUT", "/v1/billing/customers/cust-a", "{"),
    ("PUT", "/v1/billing/customers/cust-a", '{"anchor_day": "soon"}'),
    ("POST", "/v1/billing/customers/cust-a/plans", "[]"),
    ("POST", "/v1/billing/customers/cust-a/plans", '{"from": "2027-01-01"}'),
    ("POST", "/v1/billing/runs", '{"period": 5}'),
    ("POST", "/v1/billing/runs", ""),
    ("POST", "/v1/billing/invoices/inv-x/credit-notes", '{"line_ids": "all"}'),
    ("POST", "/v1/billing/customers/cust-a/credits", '{"amount": {"value": 1}}'),
    ("GET", "/v1/dead-letters?limit=many", None),
    ("GET", "/v1/deployments/d1/capacity?history=maybe", None),
]


def test_permission_checked_before_validation(api: Api) -> None:
    """On admin-only operations a customer key gets 403 and no credentials 401, whatever the body and
    the parameters hold; with the admin token the same requests get 422, in the error shape."""
    from starlette.testclient import TestClient

    client = TestClient(api.app)
    json_type = {"Content-Type": "application/json"}
    for method, url, body in MALFORMED:
        refused = client.request(method, url, content=body, headers={**json_type, "Authorization": f"Bearer {api.customer_key}"})
        assert refused.status_code == 403, (method, url, body, refused.status_code, refused.text)
        assert refused.json()["error"]["code"] == "forbidden", refused.text
        anonymous = client.request(method, url, content=body, headers=json_type)
        assert anonymous.status_code == 401, (method, url, body, anonymous.status_code, anonymous.text)
        invalid = client.request(method, url, content=body, headers={**json_type, "Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert invalid.status_code == 422, (method, url, body, invalid.status_code, invalid.text)
        assert set(invalid.json()) == {"error"} and set(invalid.json()["error"]) == {"message", "code"}, invalid.text
        assert invalid.json()["error"]["code"] == "invalid_request" and invalid.json()["error"]["message"]


def test_422_in_the_error_shape(api: Api, seeded_db: str, tmp_path) -> None:
    """Every 422 (a parameter of the wrong form, on any operation) answers {"error": {"message", "code"}},
    on the API app and on the pages-only app, and the OpenAPI document declares that shape for it."""
    from starlette.testclient import TestClient

    from dashboards.web.app import create_dashboard_app

    client = TestClient(api.app)
    answer = client.get("/v1/tasks", params={"limit": "many"}, headers={"Authorization": f"Bearer {api.customer_key}"})
    assert answer.status_code == 422, answer.text
    assert answer.json() == {"error": {"message": answer.json()["error"]["message"], "code": "invalid_request"}}
    assert "query.limit" in answer.json()["error"]["message"]
    document = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    declared = [operation["responses"]["422"] for operations in document["paths"].values()
                for operation in operations.values() if "422" in operation["responses"]]
    assert declared and all(d["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
                            for d in declared)
    settings_ = Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=seeded_db, INFERMETER_ADMIN_TOKEN=ADMIN_TOKEN,
                         INFERMETER_PRODUCER_TOKEN=PRODUCER_TOKEN)
    pages = create_dashboard_app(settings_, seeded_db, KeyStore(create_engine(seeded_db), settings=settings_))
    try:
        for app in (api.app, pages):  # a page's parameter (an int) of the wrong form
            answer = TestClient(app).get("/signin", params={"signed_out": "yes"})
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["code"] == "invalid_request", answer.text
    finally:
        pages.state.pool.close()


def test_allow_and_messages_match_the_document(api: Api) -> None:
    """A 405 names every method the document declares for the path (Starlette named the first
    route's only), and no API error quotes a CLI flag."""
    from starlette.testclient import TestClient

    client = TestClient(api.app)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for path, declared in (("/v1/billing/customers/cust-a", {"GET", "PUT"}),
                           ("/v1/billing/customers/cust-a/credits", {"GET", "POST"}),
                           ("/v1/customers/cust-a/residency", {"GET", "PUT"})):
        answer = client.options(path, headers=admin)
        assert answer.status_code == 405, (path, answer.text)
        assert set(answer.headers["allow"].split(", ")) == declared | {"HEAD"}, (path, answer.headers["allow"])
        assert answer.json()["error"]["message"]
    for method, url, body in (("POST", "/v1/billing/customers/cust-a/plans", {"price_book": BOOK_YAML, "from": ""}),
                              ("POST", "/v1/billing/customers/cust-a/credits", {"amount": "1", "expires": "2000-01-01"}),
                              ("GET", "/v1/invoices/preview?period=1999-01&customer_id=cust-a", None)):
        answer = client.request(method, url, json=body, headers=admin)
        assert answer.status_code == 400, (url, answer.text)
        message = answer.json()["error"]["message"]
        assert "--" not in message and "infermeter " not in message, message


def test_no_documentation_page_loads_from_a_cdn(api: Api) -> None:
    """FastAPI's /docs and /redoc pages load Swagger UI and ReDoc from public CDNs (blank offline, and
    they tell a third party who reads the document): they are off; the document itself is served."""
    from starlette.testclient import TestClient

    client = TestClient(api.app)
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = client.get(path)
        assert answer.status_code == 404, (path, answer.status_code)
        assert "cdn" not in answer.text.lower(), answer.text
    document = client.get("/openapi.json")
    assert document.status_code == 200 and document.json()["info"]["title"] == "infermeter"


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
