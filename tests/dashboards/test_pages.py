"""The dashboards in Chromium against the real API app (uvicorn on 127.0.0.1) and real metered data:
pages render with data, charts draw the numbers the query functions return, the browser reports no
errors and fetches nothing from outside the site, filters change what is shown, and access holds."""

from __future__ import annotations

import csv
import io
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from dashboards.sessions import SESSION_COOKIE, Session, Signer
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import Window, parse_time
from metering import queries
from tests.dashboards.conftest import ROOT, WINDOW

Q = f"from={WINDOW['from']}&to={WINDOW['to']}"
# Screenshots are taken (the pages must render) into a scratch folder; scripts/screenshots refreshes the
# committed ones of docs/dashboards.md from a demo month.


def window() -> Window:
    return Window(parse_time(WINDOW["from"], "from"), parse_time(WINDOW["to"], "to"))


def usage(site, customer: str, group_by: list[str] | None = None, w: Window | None = None) -> list[dict]:
    with psycopg.connect(to_libpq_url(site.settings.database_url)) as conn:
        return queries.usage(conn, w or window(), customer_id=customer, group_by=group_by or [])


def num(text: str) -> int:
    return int(text.replace(",", ""))


def shoot(page, name: str) -> None:
    shots = Path(tempfile.gettempdir())
    page.page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def test_customer_page_shows_its_usage_as_metering_counts_it(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}")
    p.wait_for_charts(5)
    # the numbers are metering.queries.usage's for the same customer and window
    [total] = usage(site, "cust-a")
    assert num(p.text("total-requests")) == total["requests"] == 18
    assert num(p.text("total-uncached")) == total["uncached_input_tokens"]
    assert num(p.text("total-cached")) == total["cached_input_tokens"]
    assert num(p.text("total-output")) == total["output_tokens"]
    assert p.text("cache-hit") == f"{total['cached_input_tokens'] / total['input_tokens'] * 100:.1f}%"
    # the tokens chart drew one bar per hour and kind, with the hourly numbers
    hourly = usage(site, "cust-a", ["hour"])
    drawn = {t["name"]: t for t in p.chart_data("tokens")}
    assert [h["hour"] for h in hourly] == drawn["output"]["x"]
    assert drawn["uncached input"]["y"] == [h["uncached_input_tokens"] for h in hourly]
    assert drawn["cached input"]["y"] == [h["cached_input_tokens"] for h in hourly]
    assert drawn["output"]["y"] == [h["output_tokens"] for h in hourly]
    assert p.svg_points("tokens") == 3 * len(hourly) == 12
    assert p.svg_points("requests") == len(hourly)
    assert p.svg_points("cache_hit", ".scatterlayer .point") == len(hourly)
    assert p.chart_data("requests")[0]["y"] == [h["requests"] for h in hourly]
    # GPU-hours of its dedicated deployment only (two half-hour intervals), tasks with retries
    assert p.text("gpu-hours") == "1.0000"
    assert p.svg_points("gpu") == 2
    assert (num(p.text("tasks-total")), num(p.text("tasks-succeeded")), num(p.text("tasks-attempts")),
            num(p.text("tasks-retries")), p.text("success-rate")) == (3, 2, 6, 3, "66.7%")
    spend = p.text("spend")
    assert spend.endswith("USD") and "per-token-2026-11" in p.text("spend-note")
    per_task = p.text("spend-per-task")
    from decimal import Decimal

    assert Decimal(per_task.split()[0]) == (Decimal(spend.split()[0]) / 2).quantize(Decimal("0.0001"))
    # nothing of the platform's cost or margin
    body = p.page.inner_text("main").lower()
    assert "margin" not in body and "cost" not in body
    assert "kept per project" in body and "all projects" in p.page.inner_text("select[name=project]")
    assert p.problems == []
    shoot(p, "customer")


def test_filters_and_time_range_change_what_is_shown(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}")
    p.page.select_option("select[name=model]", "m2")
    with p.page.expect_navigation():
        p.page.click("form.filters button[type=submit]")
    p.wait_for_charts(5)
    assert "model=m2" in p.page.url
    m2 = [r for r in usage(site, "cust-a", ["model"]) if r["model"] == "m2"][0]
    assert num(p.text("total-requests")) == m2["requests"] == 6
    assert p.chart_data("requests")[0]["y"] == [6]
    # a narrower window: only 10:00-12:00 of m1
    p.goto("/dashboard?from=2026-11-02T10:00:00Z&to=2026-11-02T12:00:00Z&model=m1")
    p.wait_for_charts(5)
    narrow = usage(site, "cust-a", ["model"], Window(parse_time("2026-11-02T10:00:00Z", "f"),
                                                     parse_time("2026-11-02T12:00:00Z", "t")))
    assert num(p.text("total-requests")) == narrow[0]["requests"] == 8
    assert p.svg_points("tokens") == 6
    # the default window (the last 7 days) shows only the recent traffic
    p.goto("/dashboard")
    p.wait_for_charts(5)
    assert num(p.text("total-requests")) == 5
    assert p.problems == []


def test_the_project_filter_shows_one_projects_requests_and_the_projects_add_up(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}")
    p.wait_for_charts(5)
    everything = num(p.text("total-requests"))
    assert p.page.eval_on_selector_all("select[name=project] option", "os => os.map(o => o.value)") == ["", "proj-1"]
    p.page.select_option("select[name=project]", "proj-1")
    with p.page.expect_navigation():
        p.page.click("form.filters button[type=submit]")
    p.wait_for_charts(5)
    assert "project=proj-1" in p.page.url and "proj-1" in p.text("project-note")
    with psycopg.connect(to_libpq_url(site.settings.database_url)) as conn:
        [mine] = queries.usage(conn, window(), customer_id="cust-a", project="proj-1")
        [none] = queries.usage(conn, window(), customer_id="cust-a", project="")
    assert num(p.text("total-requests")) == mine["requests"] == 10
    assert mine["requests"] + none["requests"] == everything  # the requests without a project still count
    assert sum(p.chart_data("requests")[0]["y"]) == 10
    # the chart endpoints the page links carry the filter
    got = p.context.request.get(f"{site.url}/dashboard/data/requests.json?{Q}&project=proj-1").json()
    assert got["project"] == "proj-1" and sum(r["requests"] for r in got["rows"]) == 10
    summary = p.context.request.get(f"{site.url}/dashboard/data/summary.json?{Q}&project=proj-1").json()
    assert summary["usage"]["requests"] == 10 and summary["project"] == "proj-1"
    assert p.problems == []


def test_json_and_csv_of_each_chart_match_the_page(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}")
    p.wait_for_charts(5)
    # the page reads in a worker thread (sync pool), the chart endpoints in the event loop (async read pool)
    assert site.app.state.dashboards_read_pool is not None
    for chart in ("tokens", "requests", "cache_hit", "gpu", "tasks"):
        spec = json.loads(p.page.inner_text(f"#data-{chart}"))
        got = p.context.request.get(f"{site.url}/dashboard/data/{chart}.json?{Q}")
        assert got.status == 200
        assert got.json()["rows"] == spec["rows"] and got.json()["customer_id"] == "cust-a"
        table = list(csv.DictReader(io.StringIO(p.context.request.get(f"{site.url}/dashboard/data/{chart}.csv?{Q}").text())))
        assert len(table) == len(spec["rows"])
        for line, row in zip(table, spec["rows"], strict=True):
            assert {k: ("" if v is None else str(v)) for k, v in row.items()} == line
    summary = p.context.request.get(f"{site.url}/dashboard/data/summary.json?{Q}").json()
    [total] = usage(site, "cust-a")
    assert {k: summary["usage"][k] for k in total if k != "customer_id"} == {k: v for k, v in total.items() if k != "customer_id"}
    assert summary["spend"]["spend"] + " USD" == p.text("spend")
    assert "cost" not in json.dumps(summary).lower().replace("price", "")


def test_a_customer_sees_only_itself(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    req = p.context.request
    for path in (f"/dashboard?{Q}&customer_id=cust-b", f"/dashboard/data/tokens.json?{Q}&customer_id=cust-b",
                 f"/dashboard/data/tokens.csv?{Q}&customer_id=cust-b", f"/dashboard/data/summary.json?{Q}&customer_id=cust-b"):
        assert req.get(site.url + path).status == 404, path
    # its own pages carry nothing of cust-b (model m3, 999-token outputs, deployment ded-b)
    p.goto(f"/dashboard?{Q}")
    p.wait_for_charts(5)
    shown = p.page.inner_text("body") + "".join(
        p.page.eval_on_selector_all("script[type='application/json']", "els => els.map(e => e.textContent)"))
    assert "cust-a" in shown
    for other in ("cust-b", "m3", "ded-b", "shared-1", "999"):
        assert other not in shown, other
    # admin pages and data: forbidden to a customer
    for path in ("/admin/ops", "/admin/pricing", "/admin/finance", f"/admin/pricing/data/overview.json?{Q}",
                 "/admin/ops/data/dead_letters.csv"):
        assert req.get(site.url + path, max_redirects=0).status == 403, path
    p.goto("/admin/ops")
    assert "Administrators only" in p.page.inner_text("main")
    # bearer tokens on the data endpoints: the same scope
    bearer = {"Authorization": f"Bearer {site.keys['a']}"}
    assert req.get(f"{site.url}/dashboard/data/tokens.json?{Q}&customer_id=cust-b", headers=bearer).status == 404
    b_rows = req.get(f"{site.url}/dashboard/data/tokens.json?{Q}",
                     headers={"Authorization": f"Bearer {site.keys['b']}"}).json()
    assert b_rows["customer_id"] == "cust-b" and b_rows["rows"][0]["output_tokens"] == 7 * 999


def test_forms_without_their_csrf_token_are_refused(web, site):
    p = web()
    p.goto("/signin")  # the browser now holds a CSRF cookie
    req = p.context.request
    refused = req.post(f"{site.url}/signin", form={"api_key": site.keys["a"]}, max_redirects=0)
    assert refused.status == 403 and "CSRF" in refused.text()
    forged = req.post(f"{site.url}/signin", form={"api_key": site.keys["a"], "csrf": "forged"}, max_redirects=0)
    assert forged.status == 403
    assert SESSION_COOKIE not in {c["name"] for c in p.context.cookies()}
    p.admin_sign_in(site.keys["admin"])
    refused = req.post(f"{site.url}/admin/pricing/books", form={"yaml": "id: x", "effective_from": "2026-11-01T00:00:00Z"})
    assert refused.status == 403
    assert req.post(f"{site.url}/signout", form={}, max_redirects=0).status == 403
    p.goto("/admin/ops")
    assert p.text("who") == "admin"  # still signed in
    # sign-out with its token works and ends the session
    with p.page.expect_navigation():
        p.page.click("form.signout button")
    assert "/admin/signin" in p.page.url and "signed out" in p.text("info")
    p.goto("/admin/ops")
    assert "/admin/signin" in p.page.url


def test_wrong_or_revoked_keys_and_expired_sessions_go_back_to_sign_in(web, site):
    p = web()
    p.sign_in("im_live_0123456789abcdef_" + "x" * 43)
    assert "Sign-in failed" in p.text("error") and p.page.url.endswith("/signin")
    p.sign_in(site.keys["revoked"])
    assert "revoked" in p.text("error")
    p.sign_in(site.keys["admin"])
    assert "admin sign-in" in p.text("error")
    p.admin_sign_in("not-the-admin-token")
    assert "not the admin token" in p.text("error")
    # an expired session (signed with the server's secret) is sent back to sign in, saying why
    expired = Signer(site.settings.session_secret).sign(
        Session("customer", time.time() - 5, "cust-a", site.store.list("cust-a")[0].key_id).to_payload())
    p.context.add_cookies([{"name": SESSION_COOKIE, "value": expired, "url": site.url}])
    p.goto(f"/dashboard?{Q}")
    assert "/signin" in p.page.url and "expired" in p.text("info")
    # a session whose key is revoked after sign-in ends too
    key_id, secret = site.store.create("cust-a")
    p.sign_in(secret)
    assert p.page.url.endswith("/dashboard")
    site.store.revoke(key_id)
    p.goto("/dashboard")
    assert "/signin" in p.page.url and "revoked" in p.text("info")
    # a tampered cookie is no session
    p.context.add_cookies([{"name": SESSION_COOKIE, "value": expired[:-3] + "abc", "url": site.url}])
    p.goto("/dashboard")
    assert "/signin" in p.page.url


def test_session_cookies_are_http_only_and_same_site_lax(web, site):
    p = web()
    p.sign_in(site.keys["a"])
    cookies = {c["name"]: c for c in p.context.cookies()}
    session = cookies[SESSION_COOKIE]
    assert session["httpOnly"] and session["sameSite"] == "Lax" and not session["secure"]  # plain http here
    assert cookies["im_csrf"]["httpOnly"] and cookies["im_csrf"]["sameSite"] == "Lax"
    assert 0 < session["expires"] - time.time() <= site.settings.session_ttl_s + 5
    assert p.page.evaluate("document.cookie") == ""


def test_operations_page(web, site):
    p = web()
    p.admin_sign_in(site.keys["admin"])
    assert p.page.url.endswith("/admin/ops")
    p.goto(f"/admin/ops?{Q}")
    p.wait_for_charts(3)
    assert num(p.text("events-last-hour")) == 38
    drawn = {t["name"]: t for t in p.chart_data("ingest")}
    assert sum(drawn["events"]["y"]) == 38 and sum(drawn["dead letters"]["y"]) == 2 and len(drawn["events"]["x"]) == 60
    assert p.chart_data("dead_letters")[0]["x"] == ["invalid_envelope", "invalid_json"]
    assert p.svg_points("dead_letters") == 2
    rows = p.page.eval_on_selector_all("[data-testid=deployments] tbody tr",
                                       "rs => rs.map(r => Array.from(r.cells).map(c => c.innerText))")
    assert {r[0]: (r[1], r[4], r[5]) for r in rows} == {
        "ded-a": ("cust-a", "3600", "58.3%"), "ded-b": ("cust-b", "3600", "83.3%"),
        "shared-1": ("(shared pool)", "3600", "50.0%")}
    assert p.svg_points("deployments") == 3
    assert "none" not in p.text("consumers").lower()
    assert "No gateway metrics URL is configured" in p.text("no-gateways")
    assert "No reconcile result is recorded" in p.text("no-reconcile")
    assert p.problems == []
    shoot(p, "operations")
    with p.page.expect_navigation():
        p.page.click("text=Reconcile (read-only)")
    p.wait_for_charts(3)
    assert "ok" in p.text("reconcile")
    data = p.context.request.get(f"{site.url}/admin/ops/data/deployments.json?{Q}").json()
    assert sorted(r["deployment_id"] for r in data["rows"]) == ["ded-a", "ded-b", "shared-1"]
    assert p.context.request.get(f"{site.url}/admin/ops/data/reconcile.json").json()["recorded"] is True
    assert "deployment_id,owner" in p.context.request.get(f"{site.url}/admin/ops/data/deployments.csv?{Q}").text()


def test_pricing_experiments_page(web, site):
    p = web()
    p.admin_sign_in(site.keys["admin"])
    p.goto(f"/admin/pricing?{Q}")
    p.wait_for_charts(5)
    report = p.context.request.get(f"{site.url}/admin/pricing/data/comparison.json?{Q}").json()
    ids = [b["id"] for b in report["books"]]
    assert ids == ["per-token-2026-11", "gpu-hour-2026-11", "per-task-2026-11"]
    drawn = {t["name"]: t for t in p.chart_data("overview")}
    assert drawn["revenue"]["x"] == ids
    assert drawn["revenue"]["y"] == [float(b["revenue"]) for b in report["books"]]
    assert drawn["gross margin"]["y"] == [float(b["margin"]) for b in report["books"]]
    assert p.svg_points("overview") == 9
    assert {t["name"] for t in p.chart_data("customers")} == {"gpu-hour-2026-11 - per-token-2026-11",
                                                              "per-task-2026-11 - per-token-2026-11"}
    assert p.svg_points("caching") > 0 and p.svg_points("retries") == 6
    shadow = p.context.request.get(f"{site.url}/admin/pricing/data/shadow.json").json()
    assert [r["book"] for r in shadow["rows"]] and all(r["customers"] == 1 for r in shadow["rows"])  # cust-a, recent
    assert p.svg_points("shadow") == 2 * len(shadow["rows"])
    assert p.problems == []
    shoot(p, "pricing")
    # books: only the first two, per-task as baseline
    p.goto(f"/admin/pricing?{Q}&book=" + report["books"][2]["source"] + "&book=" + report["books"][0]["source"])
    p.wait_for_charts(5)
    assert p.chart_data("overview")[0]["x"] == ["per-task-2026-11", "per-token-2026-11"]
    # upload a book (a form POST with its CSRF token), then compare it as a stored book
    text = (ROOT / "pricing_books" / "per-token.yaml").read_text().replace("id: per-token-2026-11", "id: cheaper-2026-11") \
        .replace('amount: "7.00"', 'amount: "5.00"')
    p.page.fill("[data-yaml-text]", text)
    p.page.fill("input[name=effective_from]", "2026-11-01T00:00")  # the date picker: UTC, to the minute
    with p.page.expect_navigation():
        p.page.click("[data-testid=upload] button")
    assert "cheaper-2026-11" in p.text("uploaded")
    assert "cheaper-2026-11" in p.text("versions")
    p.goto(f"/admin/pricing?{Q}&book=" + report["books"][0]["source"] + "&book=stored:cheaper-2026-11")
    p.wait_for_charts(5)
    assert p.chart_data("overview")[0]["x"] == ["per-token-2026-11", "cheaper-2026-11"]
    rows = p.context.request.get(
        f"{site.url}/admin/pricing/data/customers.csv?{Q}&book={report['books'][0]['source']}&book=stored:cheaper-2026-11").text()
    assert rows.splitlines()[0] == "customer_id,cheaper-2026-11"
    # a bad book is refused with its reasons
    p.page.fill("[data-yaml-text]", "id: broken\ncharges: nope\n")
    with p.page.expect_navigation():
        p.page.click("[data-testid=upload] button")
    assert "not stored" in p.text("message")


@pytest.mark.parametrize("path", ["/dashboard", "/admin/ops", "/admin/pricing", "/dashboard/data/tokens.json"])
def test_signed_out_visitors_are_sent_to_sign_in(site, web, path):
    p = web()
    response = p.context.request.get(site.url + path, max_redirects=0)
    if path.endswith(".json"):
        assert response.status == 401
    else:
        assert response.status == 303
        assert response.headers["location"].startswith("/admin/signin" if path.startswith("/admin") else "/signin")


def test_nothing_leaves_the_site_and_plotly_is_served_locally(site, web):
    p = web()
    js = p.context.request.get(f"{site.url}/static/plotly.min.js")
    assert js.status == 200 and b"plotly.js v" in js.body()[:200]
    p.sign_in(site.keys["a"])
    p.goto(f"/dashboard?{Q}")
    p.wait_for_charts(5)
    scripts = p.page.eval_on_selector_all("script[src]", "els => els.map(e => e.getAttribute('src'))")
    assert scripts == ["/static/plotly.min.js", "/static/dashboards.js"]
    assert p.problems == []


def test_signin_page_screenshot(site, web):
    p = web()
    p.goto("/signin")
    shoot(p, "signin")
    assert datetime.now(UTC)  # the page rendered


def test_billing_sections_show_only_when_billing_is_registered(site, web):
    import dataclasses

    from dashboards.web.app import create_dashboard_app
    from tests.dashboards.conftest import served

    p = web()
    p.admin_sign_in(site.keys["admin"])
    p.goto(f"/dashboard?{Q}")  # an admin picks a customer first
    options = p.page.eval_on_selector_all("select[name=customer_id] option", "os => os.map(o => o.value)")
    assert options == ["cust-a", "cust-b"]
    assert site.app.state.billing is not None  # the API app wires billing's views
    unwired = create_dashboard_app(site.settings, site.settings.database_url, site.store)  # the pages without billing
    with served(unwired) as url:
        q = web(dataclasses.replace(site, url=url, app=unwired))
        q.admin_sign_in(site.keys["admin"])
        q.goto(f"/dashboard?{Q}&customer_id=cust-b")
        q.wait_for_charts(5)
        assert num(q.text("total-output")) == 7 * 999
        assert q.page.query_selector("[data-testid=invoices]") is None
        assert q.page.query_selector("[data-testid=current-period]") is None
        assert q.context.request.get(f"{url}/dashboard/invoices.json?customer_id=cust-b").status == 404
        q.goto("/admin/finance")
        assert "Billing is not wired yet" in q.text("finance-placeholder")
        assert q.problems == []
    p.goto(f"/dashboard?{Q}&customer_id=cust-b")
    p.wait_for_charts(5)
    assert p.page.query_selector("[data-testid=invoices]") is not None
    assert p.page.query_selector("[data-testid=current-period]") is not None
    p.goto("/admin/finance")
    assert p.page.query_selector("[data-testid=finance-placeholder]") is None
    assert p.problems == []


@pytest.mark.parametrize("window_text", [WINDOW, {"from": "2026-10-28T00:00:00Z", "to": "2026-11-28T00:00:00Z"}],
                         ids=["hourly", "daily"])
def test_usage_charts_summed_by_postgresql_equal_metering_usage_summed_per_bucket(site, window_text):
    """The usage charts' series (metering.customer_dashboard_reads.customer_usage_series: PostgreSQL
    sums per bucket) equal metering.queries.usage by model and bucket summed per bucket, sync and
    async, with and without a model filter (an unknown model: no buckets, the customer's models still
    listed)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from dashboards import views

    w = Window(parse_time(window_text["from"], "from"), parse_time(window_text["to"], "to"))
    bucket = views.bucket_for(w)
    url = to_libpq_url(site.settings.database_url)

    async def read_async(customer: str, model: str | None, models: bool = True, totals_only: bool = False) -> dict:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await views.customer_usage_async(conn, w, customer, model, models=models, totals_only=totals_only)

    def read_in_a_loop(customer: str, model: str | None, models: bool = True,
                       totals_only: bool = False) -> dict:  # Playwright's loop runs in this thread
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, read_async(customer, model, models, totals_only)).result()

    with psycopg.connect(url, autocommit=True) as conn:
        for customer, model in [("cust-a", None), ("cust-a", "m1"), ("cust-a", "m2"), ("cust-a", "nope"),
                                ("cust-b", None), ("cust-nobody", None)]:
            expected = views.usage_view(queries.usage(conn, w, customer_id=customer, group_by=["model", bucket]),
                                        bucket, model)
            assert views.customer_usage(conn, w, customer, model) == expected
            assert read_in_a_loop(customer, model) == expected
            # the charts' JSON endpoints: the buckets alone (one GROUP BY), no model list
            without_models = {**expected, "models": None}
            assert views.customer_usage(conn, w, customer, model, models=False) == without_models
            assert read_in_a_loop(customer, model, models=False) == without_models
            # the summary: the totals and the models from the sums per model
            for totals in (views.customer_usage(conn, w, customer, model, totals_only=True),
                           read_in_a_loop(customer, model, totals_only=True)):
                assert (totals["totals"], totals["models"], totals["bucket"]) == (expected["totals"], expected["models"], None)
                assert len(totals["series"]) == (1 if expected["series"] else 0)
            gpu = views.customer_gpu(conn, w, customer)
            gpu_totals = views.customer_gpu(conn, w, customer, totals_only=True)
            assert (gpu_totals["deployments"], gpu_totals["total_gpu_hours"], gpu_totals["series"]) == (
                gpu["deployments"], gpu["total_gpu_hours"], [])
    assert gpu_totals["total_gpu_hours"] == "0.0000"  # cust-nobody; cust-a's and cust-b's were compared above
    assert expected["series"] == [] and expected["models"] == []  # cust-nobody


def test_data_endpoints_answer_the_same_from_the_event_loop_and_from_a_worker_thread(site):
    """The running server reads the chart endpoints in its event loop (async read pool) and the summary
    in two halves at once (spend in a worker thread, the data sets in the loop); the same app called
    from another event loop (Starlette's TestClient, no lifespan) reads all of them in a worker thread
    from the sync pool, as the page does. Both answer the same JSON, with and without a model filter."""
    import httpx
    from fastapi.testclient import TestClient

    headers = {"Authorization": f"Bearer {site.keys['a']}"}
    assert site.app.state.dashboards_read_pool is not None
    threaded = TestClient(site.app)
    for chart in ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary"):
        for query in (Q, f"{Q}&model=m2", "from=2026-10-28T00:00:00Z&to=2026-11-28T00:00:00Z"):
            path = f"/dashboard/data/{chart}.json?{query}"
            in_loop = httpx.get(f"{site.url}{path}", headers=headers)
            in_thread = threaded.get(path, headers=headers)
            assert in_loop.status_code == in_thread.status_code == 200
            assert in_loop.json() == in_thread.json(), path
    assert in_loop.json()["spend"]["spend_per_successful_task"] is not None


def test_chart_data_fast_path_answers_what_the_route_answers(site):
    """GET /dashboard/data/{chart}.json with a customer's bearer key is answered by dashboards.web's
    DataFastPath (before FastAPI's routing) in the server: the same status, body bytes and headers as
    the route (Starlette's TestClient calls the app from another event loop, where the fast path steps
    aside). Everything it does not answer (other credentials, another customer, bad times, CSV, no
    bearer key) reaches the route and answers as before. The server is an API app of its own, served
    behind a recorder of the requests no route handled (Starlette's router puts the matched route in
    the request's scope; the fast path answers before it)."""
    import httpx
    from fastapi.testclient import TestClient

    from app.api import create_app
    from tests.dashboards.conftest import served

    answered: list[str] = []
    app = create_app(site.settings, site.settings.database_url, None, keys=site.store)

    async def recorded(scope, receive, send):
        await app(scope, receive, send)
        if scope["type"] == "http" and "route" not in scope:
            answered.append(scope["path"])

    threaded = TestClient(site.app)
    a = {"Authorization": f"Bearer {site.keys['a']}"}
    cases = [(f"/dashboard/data/{chart}.json?{query}", a, 200)
             for chart in ("tokens", "requests", "cache_hit", "gpu", "tasks", "summary")
             for query in (Q, f"{Q}&model=m2", f"{Q}&customer_id=cust-a", f"{Q}&to=2026-11-04T00:00:00Z&to={WINDOW['to']}")]
    fast = len(cases)
    admin = {"Authorization": f"Bearer {site.keys['admin']}"}
    cases += [
        (f"/dashboard/data/tokens.json?{Q}&customer_id=cust-b", a, 404),  # another customer
        ("/dashboard/data/tokens.json?from=yesterday", a, 400),  # bad times
        (f"/dashboard/data/tokens.csv?{Q}", a, 200),  # CSV: the route
        (f"/dashboard/data/nope.json?{Q}", a, 404),  # no such chart
        (f"/dashboard/data/tokens.json?{Q}", {"Authorization": f"Bearer {site.keys['revoked']}"}, 401),
        (f"/dashboard/data/tokens.json?{Q}", {"Authorization": "Basic abc"}, 401),
        (f"/dashboard/data/tokens.json?{Q}", {}, 401),  # not signed in
        (f"/dashboard/data/tokens.json?{Q}&customer_id=cust-b", admin, 200),  # admins: the route
        (f"/dashboard/data/tokens.json?{Q}", admin, 400),  # an admin without customer_id
    ]
    with served(recorded) as url:
        for path, headers, status in cases:
            answer = httpx.get(f"{url}{path}", headers=headers)
            routed = threaded.get(path, headers=headers)
            assert (answer.status_code, answer.content) == (status, routed.content), path
            assert routed.status_code == status, path
            assert [(k, v) for k, v in answer.headers.raw if k not in (b"date", b"server")] == routed.headers.raw, path
    assert len(answered) == fast  # the server's fast path answered every customer JSON request, nothing else


def test_a_signed_in_session_reads_its_key_from_the_key_cache_and_ends_when_the_key_is_revoked(site):
    """A request signed in by session cookie takes its key from the key store's verified-key cache
    (no database read while the entry lives, as for a bearer key); revoking the key ends the session.
    The server is an API app of its own, built with a key store that counts its database lookups."""
    import httpx
    from psycopg_pool import ConnectionPool
    from sqlalchemy import create_engine

    from app.api import create_app
    from dashboards.sessions import SessionStore, new_session_id
    from serving.keys import KeyStore
    from tests.dashboards.conftest import served

    lookups: list[tuple] = []

    class CountedKeyStore(KeyStore):
        def _lookup(self, *args):
            lookups.append(args)
            return super()._lookup(*args)

    store = CountedKeyStore(create_engine(site.settings.database_url), settings=site.settings, cache_ttl_s=60)
    key_id, _ = store.create("cust-a")
    session = Session("customer", time.time() + 60, "cust-a", key_id, session_id=new_session_id())
    with ConnectionPool(to_libpq_url(site.settings.database_url), min_size=1, max_size=1) as pool:
        SessionStore(pool, cache_ttl_s=0).start(session)  # as signing in records it
    cookie = Signer(site.settings.session_secret).sign(session.to_payload())
    with served(create_app(site.settings, site.settings.database_url, None, keys=store)) as url:
        for path in (f"/dashboard/data/tokens.json?{Q}", f"/dashboard/data/summary.json?{Q}", f"/dashboard?{Q}"):
            answer = httpx.get(f"{url}{path}", cookies={SESSION_COOKIE: cookie})
            assert answer.status_code == 200, (path, answer.text)
        assert len(lookups) == 1  # the first request read the key; the others used the cache
        assert store.revoke(key_id)
        answer = httpx.get(f"{url}/dashboard/data/tokens.json?{Q}", cookies={SESSION_COOKIE: cookie})
        assert answer.status_code == 401 and "revoked" in answer.json()["error"]["message"]
        answer = httpx.get(f"{url}/dashboard?{Q}", cookies={SESSION_COOKIE: cookie}, follow_redirects=False)
        assert answer.status_code == 303 and "/signin" in answer.headers["location"]
