"""Credentials without well-known defaults, the listen-address guard, the session and CSRF
signatures, and the metering /metrics endpoint."""

from __future__ import annotations

import os
import stat
import time
import urllib.request

import pytest

from dashboards.sessions import Session, Signer, read_session
from infermeter.credentials import is_loopback, load_or_create_credentials
from infermeter.settings import Settings


def test_unset_tokens_are_generated_once_per_home_with_mode_0600(tmp_path, monkeypatch):
    for var in ("INFERMETER_ADMIN_TOKEN", "INFERMETER_PRODUCER_TOKEN", "INFERMETER_SESSION_SECRET"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings(INFERMETER_HOME=tmp_path / "home")
    admin, producer = settings.admin_token, settings.producer_token
    assert len(admin) >= 40 and admin != producer and admin != "dev-admin-token"
    path = tmp_path / "home" / "credentials.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = Settings(INFERMETER_HOME=tmp_path / "home")
    assert (again.admin_token, again.producer_token, again.session_secret) == (admin, producer, settings.session_secret)
    assert Settings(INFERMETER_HOME=tmp_path / "other").admin_token != admin
    assert str(path.resolve()) in settings.credentials_note()
    assert settings.development_credentials() == ["INFERMETER_ADMIN_TOKEN", "INFERMETER_PRODUCER_TOKEN"]
    assert load_or_create_credentials(path)["admin_token"] == admin


def test_settings_alone_write_nothing(tmp_path):
    Settings(INFERMETER_HOME=tmp_path / "home", INFERMETER_API_PORT=1)
    assert not (tmp_path / "home").exists()  # generated only when a token is used


def test_no_listening_off_loopback_with_development_credentials(tmp_path):
    dev = Settings(INFERMETER_HOME=tmp_path)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        dev.check_listen_address(host)
    with pytest.raises(ValueError, match="refusing to listen on 0.0.0.0"):
        dev.check_listen_address("0.0.0.0")
    with pytest.raises(ValueError, match="INFERMETER_PRODUCER_TOKEN"):
        Settings(INFERMETER_HOME=tmp_path, INFERMETER_ADMIN_TOKEN="a-real-secret").check_listen_address("10.0.0.5")
    with pytest.raises(ValueError):
        Settings(INFERMETER_HOME=tmp_path, INFERMETER_ADMIN_TOKEN="dev-admin-token",
                 INFERMETER_PRODUCER_TOKEN="p-secret").check_listen_address("0.0.0.0")
    Settings(INFERMETER_HOME=tmp_path, INFERMETER_ADMIN_TOKEN="a-secret",
             INFERMETER_PRODUCER_TOKEN="p-secret").check_listen_address("0.0.0.0")
    assert not is_loopback("example.com") and is_loopback("[::1]")


def test_the_cli_refuses_a_public_address_with_development_credentials(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERMETER_")}
    env.update(INFERMETER_HOME=str(tmp_path), PYTHONPATH=os.getcwd())
    for args in (["api", "--host", "0.0.0.0"], ["serve", "dashboards", "--host", "0.0.0.0"]):
        result = subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, result.stderr
        assert "refusing to listen on 0.0.0.0" in result.stderr


def test_sessions_are_signed_and_expire():
    signer = Signer("secret")
    cookie = signer.sign(Session("customer", time.time() + 60, "cust-a", "k1").to_payload())
    state, session = read_session(signer, cookie)
    assert state == "ok" and session.customer_id == "cust-a"
    assert read_session(Signer("other secret"), cookie)[0] == "invalid"
    body, mac = cookie.split(".")
    tampered = body[:5] + ("A" if body[5] != "A" else "B") + body[6:]
    assert read_session(signer, tampered + "." + mac)[0] == "invalid"
    assert read_session(signer, "garbage")[0] == "invalid" and read_session(signer, None)[0] == "none"
    old = signer.sign(Session("admin", time.time() - 1).to_payload())
    assert read_session(signer, old)[0] == "expired"
    assert signer.csrf_ok("nonce-1234567890", signer.csrf_token("nonce-1234567890"))
    assert not signer.csrf_ok("nonce-1234567890", signer.csrf_token("another-nonce-123"))
    assert not signer.csrf_ok(None, signer.csrf_token("x")) and not signer.csrf_ok("x", None)


def test_metering_metrics_come_from_the_tables(site):
    with urllib.request.urlopen(f"{site.url}/metrics/metering", timeout=10) as response:
        text = response.read().decode()
    assert 'infermeter_metering_dead_letters_total{reason="invalid_json"} 1.0' in text
    consumed = [line for line in text.splitlines() if line.startswith("infermeter_metering_consumed_messages_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in consumed) == 38 + 2
    assert "infermeter_metering_event_delay_seconds" in text


def test_the_pages_alone_serve_sign_in_and_data(site):
    """`infermeter serve dashboards` runs create_dashboard_app: pages and their data, no /v1 API."""
    from fastapi.testclient import TestClient

    from dashboards.web.app import create_dashboard_app

    app = create_dashboard_app(site.settings, site.settings.database_url, site.store)
    with TestClient(app) as client:
        assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"
        assert client.get("/signin").status_code == 200
        assert client.get("/v1/usage").status_code == 404
        got = client.get("/dashboard/data/tokens.json?from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z",
                         headers={"Authorization": f"Bearer {site.keys['a']}"})
        assert got.status_code == 200 and sum(r["requests"] for r in got.json()["rows"]) == 18
