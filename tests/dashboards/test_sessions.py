"""Sessions end on the server, in every process that serves the pages: signing out, revoking the API key
a session was opened with, and rotating the admin token each end the session, and a browser that kept
the `im_session` cookie is sent back to sign in. The site (the API app) and a second process,
`infermeter serve dashboards` on the same database and home, share PostgreSQL and nothing else."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from psycopg_pool import ConnectionPool

from dashboards.sessions import SESSION_COOKIE, Session, SessionStore, new_session_id
from infermeter.settings import Settings
from infermeter.stack.ports import free_port, wait_for_port
from infermeter.stack.postgres import to_libpq_url
from tests.dashboards.conftest import ROOT, WINDOW, served

Q = f"from={WINDOW['from']}&to={WINDOW['to']}"
# the other process's caches (INFERMETER_SESSION_CACHE_TTL_S, INFERMETER_KEY_CACHE_TTL_S: 2 s each) and slack
OTHER_PROCESS_SEES_IT_WITHIN_S = 2 + 4


@pytest.fixture(scope="module")
def other_process(site) -> Iterator[str]:
    """`infermeter serve dashboards` on the site's database and home (so the same session secret and
    admin token), in a process of its own: its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERMETER_") and k != "KAFKA_BOOTSTRAP"}
    env.update(DATABASE_URL=site.settings.database_url, INFERMETER_HOME=str(site.settings.home), PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "dashboards", "--port", str(port)], cwd=ROOT,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def session_cookie(page) -> dict:
    [cookie] = [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
    return cookie


def replayed(web, site, viewport, cookie: dict, url: str, path: str):
    """A fresh browser holding only the saved cookie opens `path` on `url` (the site's, or the other
    process's): the page it lands on."""
    page = web(dataclasses.replace(site, url=url), viewport=viewport)
    page.context.add_cookies([{"name": SESSION_COOKIE, "value": cookie["value"], "url": url}])
    page.page.goto(url + path)
    return page


def lands_on_sign_in_within(web, site, viewport, cookie: dict, url: str, path: str, seconds: float):
    """The saved cookie is refused on `url` within `seconds` (each try a fresh browser): the page."""
    deadline = time.monotonic() + seconds
    while True:
        page = replayed(web, site, viewport, cookie, url, path)
        if "signin" in page.page.url or time.monotonic() > deadline:
            return page
        page.close()
        time.sleep(0.3)


def test_signing_out_ends_the_session_in_every_process(web, site, other_process, viewport):
    p = web(viewport=viewport)
    p.sign_in(site.keys["a"])
    saved = session_cookie(p)
    for url in (site.url, other_process):  # the session opens the dashboard in both processes
        before = replayed(web, site, viewport, saved, url, f"/dashboard?{Q}")
        assert before.page.url.startswith(url + "/dashboard") and before.text("who") == "cust-a", url
    p.goto(f"/dashboard?{Q}")
    with p.page.expect_navigation():
        p.page.click("form.signout button")
    assert "/signin?signed_out=1" in p.page.url and "signed out" in p.text("info")
    # the kept cookie: sent back to sign in by the process that signed out at once, by the other within its cache
    here = replayed(web, site, viewport, saved, site.url, f"/dashboard?{Q}")
    assert "/signin" in here.page.url and "signed out" in here.text("info")
    there = lands_on_sign_in_within(web, site, viewport, saved, other_process, f"/dashboard?{Q}", OTHER_PROCESS_SEES_IT_WITHIN_S)
    assert "/signin" in there.page.url and "signed out" in there.text("info")
    # nor does it read data (401 in the API's error shape), in either process
    for url in (site.url, other_process):
        answer = here.context.request.get(f"{url}/dashboard/data/tokens.json?{Q}")
        assert answer.status == 401 and answer.json()["error"]["code"] == "unauthenticated", url
    assert p.problems == [] and here.problems == [] and there.problems == []


def test_revoking_the_key_ends_its_sessions_in_every_process(web, site, other_process, viewport):
    key_id, key = site.store.create("cust-a")
    p = web(viewport=viewport)
    p.sign_in(key)
    saved = session_cookie(p)
    assert replayed(web, site, viewport, saved, other_process, f"/dashboard?{Q}").page.url.startswith(other_process + "/dashboard")
    assert site.store.revoke(key_id)
    here = replayed(web, site, viewport, saved, site.url, f"/dashboard?{Q}")
    assert "/signin" in here.page.url and "revoked" in here.text("info")
    there = lands_on_sign_in_within(web, site, viewport, saved, other_process, f"/dashboard?{Q}", OTHER_PROCESS_SEES_IT_WITHIN_S)
    assert "/signin" in there.page.url and "revoked" in there.text("info")


def test_rotating_the_admin_token_ends_admin_sessions(web, site, other_process, viewport):
    """A process started with a new admin token refuses the sessions opened with the old one; signing
    out of an admin session ends it in the other process too."""
    p = web(viewport=viewport)
    p.admin_sign_in(site.keys["admin"])
    saved = session_cookie(p)
    assert replayed(web, site, viewport, saved, other_process, "/admin/ops").page.url == other_process + "/admin/ops"
    rotated_settings = Settings(INFERMETER_HOME=site.settings.home, DATABASE_URL=site.settings.database_url,
                                INFERMETER_ADMIN_TOKEN="a-rotated-admin-token-" + "x" * 24)
    from app.api import create_app

    rotated = create_app(rotated_settings, site.settings.database_url, None, keys=site.store)
    with served(rotated) as url:
        after = replayed(web, site, viewport, saved, url, "/admin/ops")
        assert "/admin/signin" in after.page.url and "admin token changed" in after.text("info")
        q = web(dataclasses.replace(site, url=url, app=rotated), viewport=viewport)
        q.admin_sign_in(rotated_settings.admin_token)  # the new token signs in
        assert q.page.url == url + "/admin/ops"
    with p.page.expect_navigation():
        p.page.click("form.signout button")
    there = lands_on_sign_in_within(web, site, viewport, saved, other_process, "/admin/ops", OTHER_PROCESS_SEES_IT_WITHIN_S)
    assert "/admin/signin" in there.page.url and "signed out" in there.text("info")


def test_a_process_reads_a_session_once_per_cache_ttl_and_sees_its_own_sign_out_at_once(site):
    """Two stores (two processes' caches) on the site's database, on a clock the test moves: a session
    is read from PostgreSQL once per INFERMETER_SESSION_CACHE_TTL_S; the store that ends it refuses it
    at once, the other when its entry expires, and neither reads it again for the TTL after."""
    reads: list[str] = []
    now = [100.0]

    class Counted(SessionStore):
        def _read(self, session_id: str) -> bool:
            reads.append(session_id)
            return super()._read(session_id)

    def live(store: SessionStore, session_id: str) -> bool:  # Playwright's loop may run in this thread
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, store.is_live(session_id)).result()

    with ConnectionPool(to_libpq_url(site.settings.database_url), min_size=1, max_size=2) as pool:
        here, there = (Counted(pool, cache_ttl_s=2, clock=lambda: now[0]) for _ in range(2))
        session = Session("customer", time.time() + 60, "cust-a", "k", session_id=new_session_id())
        here.start(session)
        assert live(here, session.session_id) and reads == []  # started here: known live
        assert live(there, session.session_id) and live(there, session.session_id) and len(reads) == 1
        here.end(session.session_id)
        assert not live(here, session.session_id) and len(reads) == 1  # at once, without a read
        now[0] += 1.9
        assert live(there, session.session_id) and len(reads) == 1  # the other process: its entry still holds
        now[0] += 0.2
        assert not live(there, session.session_id) and len(reads) == 2  # expired: read, ended
        assert not live(there, session.session_id) and len(reads) == 2
        assert not live(there, "no-such-session") and not live(there, "") and reads[2:] == ["no-such-session"]
        uncached = SessionStore(pool, cache_ttl_s=0)
        other = Session("admin", time.time() + 60, session_id=new_session_id())
        uncached.start(other)
        assert live(uncached, other.session_id)
        uncached.end(other.session_id)
        assert not live(uncached, other.session_id)
