"""Per-client backoff on failed authentication (dashboards.web.backoff.AuthBackoff in front of the API app,
served by uvicorn): fifty wrong API keys, admin tokens or sign-ins from one address are answered 401 only
until the allowance is spent, then 429 with Retry-After, the wait doubling with each further failure;
a customer or admin from another address is served at once all along. Clients are real connections
from distinct loopback addresses (127.0.0.2 and up)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from dashboards.web.backoff import AuthBackoff
from infermeter.auth_backoff import FailedAuthentications
from infermeter.settings import Settings
from tests.dashboards.conftest import WINDOW, served

Q = f"from={WINDOW['from']}&to={WINDOW['to']}"
CUSTOMER = "127.0.0.2"  # the real customer's (and admin's) address
WRONG_KEY = "im_live_0123456789abcdef_" + "x" * 43
ALLOWED = 5  # INFERMETER_AUTH_FAILURES_ALLOWED's default


def from_address(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def guarded(site) -> Iterator[tuple[str, list[float]]]:
    """The API app (pages included; create_app puts it behind AuthBackoff) with the default allowance and
    longest wait, on a clock the test moves: its URL and the clock."""
    from app.api import create_app

    defaults = {name: Settings.model_fields[name].default for name in ("auth_failures_allowed", "auth_backoff_max_s")}
    assert defaults == {"auth_failures_allowed": ALLOWED, "auth_backoff_max_s": 300}
    settings = site.settings.model_copy(update=defaults)
    now = [1000.0]
    app = create_app(settings, settings.database_url, None, keys=site.store, auth_clock=lambda: now[0])
    with served(app) as url:
        yield url, now


def sign_in_form(client: httpx.Client, url: str, path: str) -> str:
    """The CSRF token of a sign-in form (GET: no credentials, never held back)."""
    page = client.get(url + path)
    assert page.status_code == 200
    return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


# what is attacked: the data fast path, metering's, billing's and pricing's API (each router of the app),
# the admin token, the two sign-in forms; each from an address of its own
KINDS = {"bearer API key": "127.0.0.3", "API bearer key": "127.0.0.4", "admin token": "127.0.0.5",
         "customer sign-in": "127.0.0.6", "admin sign-in": "127.0.0.7", "billing API key": "127.0.0.9",
         "pricing admin token": "127.0.0.10"}
PATHS = {"bearer API key": f"/dashboard/data/tokens.json?{Q}", "API bearer key": f"/v1/usage?{Q}",
         "admin token": "/admin/ops/data/dead_letters.json", "billing API key": "/v1/billing/invoices",
         "pricing admin token": "/v1/pricing/shadow?customer_id=cust-a"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_fifty_failures_are_not_answered_at_full_speed_and_others_are_served_at_once(site, guarded, kind):
    url, now = guarded
    attacker_address = KINDS[kind]
    with from_address(attacker_address) as attacker, from_address(CUSTOMER) as customer:
        if kind.endswith("sign-in"):
            path = "/signin" if kind == "customer sign-in" else "/admin/signin"
            field = "api_key" if kind == "customer sign-in" else "admin_token"
            token = sign_in_form(attacker, url, path)

            def wrong() -> httpx.Response:
                return attacker.post(url + path, data={"csrf": token, field: WRONG_KEY})

            def right(client: httpx.Client) -> httpx.Response:
                secret = site.keys["a"] if kind == "customer sign-in" else site.keys["admin"]
                return client.post(url + path, data={"csrf": sign_in_form(client, url, path), field: secret})
        else:
            path = PATHS[kind]

            def wrong() -> httpx.Response:
                return attacker.get(url + path, headers=bearer(WRONG_KEY))

            def right(client: httpx.Client) -> httpx.Response:
                return client.get(url + path, headers=bearer(site.keys["admin" if "admin" in kind else "a"]))

        answers = [wrong() for _ in range(50)]
        # the allowance, then the failure that starts the wait; after it, 429 until the wait is over
        assert [a.status_code for a in answers] == [401] * (ALLOWED + 1) + [429] * (50 - ALLOWED - 1)
        held = answers[ALLOWED + 1]
        assert held.headers["retry-after"] == "1"
        if kind.endswith("sign-in"):
            assert "Too many failed sign-ins" in held.text and "1 s" in held.text
        else:
            assert held.json()["error"]["code"] == "too_many_failed_authentications"
        assert right(attacker).status_code == 429  # the attacker's address waits, whatever it presents
        assert right(customer).status_code in (200, 303)  # another address: at once
        # each further failure doubles the wait, up to INFERMETER_AUTH_BACKOFF_MAX_S
        for expected_wait in (2, 4, 8, 16, 32, 64, 128, 256, 300, 300):
            now[0] += float(answers[-1].headers["retry-after"])
            assert wrong().status_code == 401
            answers.append(wrong())
            assert (answers[-1].status_code, answers[-1].headers["retry-after"]) == (429, str(expected_wait))
        assert right(customer).status_code in (200, 303)
        now[0] += 300
        assert right(attacker).status_code in (200, 303)  # the wait over, the right credentials work


def test_requests_without_credentials_pass_and_a_quiet_client_starts_over(site, guarded):
    url, now = guarded
    with from_address("127.0.0.8") as client:
        for _ in range(ALLOWED + 1):
            assert client.get(f"{url}/v1/usage?{Q}", headers=bearer(WRONG_KEY)).status_code == 401
        assert client.get(f"{url}/v1/usage?{Q}", headers=bearer(site.keys["a"])).status_code == 429
        assert client.get(f"{url}/signin").status_code == 200  # the sign-in page, static files: no credentials
        assert client.get(f"{url}/static/dashboards.css").status_code == 200
        assert client.get(f"{url}/dashboard/data/tokens.json?{Q}").status_code == 401  # no credentials: not held


@pytest.mark.parametrize(("failures", "quiet_s", "wait_s"), [
    (5, 0, 0.0), (6, 0, 1.0), (7, 0, 2.0), (15, 0, 300.0), (200, 0, 300.0),
    (6, 599, 0.0),  # the wait is over, the failures still count: the next failure waits 2 s
    (6, 601, 0.0),  # quiet for twice the longest wait: forgotten, the next failure is free again
])
def test_the_wait_after_failures(failures, quiet_s, wait_s):
    now = [0.0]
    backoff = FailedAuthentications(allowed=5, max_wait_s=300, clock=lambda: now[0])
    for _ in range(failures):
        backoff.failed("a")
    now[0] += quiet_s
    assert backoff.wait_s("a") == wait_s and backoff.wait_s("b") == 0
    if quiet_s:
        backoff.failed("a")
        assert backoff.wait_s("a") == (2.0 if quiet_s < 600 else 0.0)
    assert not FailedAuthentications(allowed=5, max_wait_s=0).active


def test_the_allowance_is_a_setting_and_its_last_failure_starts_the_wait(monkeypatch):
    """INFERMETER_AUTH_FAILURES_ALLOWED=2: two failures are answered as they are, the third is answered
    too and starts a 1 s wait: the next attempt from that address, right key or not, is 429; another
    address's right key is served. (A bare ASGI app behind the middleware: 401 unless the key is right.)"""
    monkeypatch.setenv("INFERMETER_AUTH_FAILURES_ALLOWED", "2")
    settings = Settings()
    assert (settings.auth_failures_allowed, settings.auth_backoff_max_s) == (2, 300)

    async def api(scope, receive, send) -> None:
        right = (b"authorization", b"Bearer right") in scope["headers"]
        await send({"type": "http.response.start", "status": 200 if right else 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    now = [0.0]
    guarded_api = AuthBackoff(api, settings=settings, clock=lambda: now[0])

    async def attempts() -> list[tuple[int, str | None]]:
        answers = []
        for address, key in [("10.0.0.1", "wrong")] * 3 + [("10.0.0.1", "right"), ("10.0.0.2", "right"),
                                                             ("10.0.0.1", "wrong")]:
            transport = httpx.ASGITransport(guarded_api, client=(address, 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                answer = await client.get("/v1/usage", headers=bearer(key))
            answers.append((answer.status_code, answer.headers.get("retry-after")))
        return answers

    assert asyncio.run(attempts()) == [(401, None), (401, None), (401, None), (429, "1"), (200, None), (429, "1")]
    now[0] += 1
    assert asyncio.run(attempts())[:2] == [(401, None), (429, "2")]  # the wait over; one more failure: 2 s
