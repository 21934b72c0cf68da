"""`infermeter demo --serve`: the demo ends by printing the dashboards' addresses with a demo customer's
API key and the admin sign-in, keeps the API and the pages up with metering running (an event posted
to it is metered), and SIGTERM stops it and everything it started."""

from __future__ import annotations

import csv
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from infermeter.stack.ports import free_port, wait_for_port
from tests.cli.test_up import _left_behind
from tests.metering.conftest import request_event


def _sign_in(client: httpx.Client, path: str, field: str, secret: str) -> httpx.Response:
    form = client.get(path).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)
    return client.post(path, data={field: secret, "csrf": csrf}, follow_redirects=True)


def test_demo_serve_prints_the_dashboards_serves_them_meters_posted_events_and_stops_on_sigterm():
    home = Path(tempfile.mkdtemp(prefix="infermeter-demo-serve-")) / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP", "INFERMETER_ADMIN_TOKEN", "INFERMETER_PRODUCER_TOKEN")}
    env.update(INFERMETER_HOME=str(home), COLUMNS="80")
    demo = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--requests", "300", "--serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(demo.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not any("operations http" in line for line in out):
            assert demo.poll() is None, "".join(out)
            assert time.monotonic() < deadline, "".join(out)
            time.sleep(0.2)
        printed = "".join(out)
        base = f"http://127.0.0.1:{port}"
        assert "serving until Ctrl-C" in printed
        key = re.search(r"^\s+(im_live_\S+)$", printed, re.M).group(1)
        admin_token = re.search(r"admin token \(development.*\):\n\s+(\S+)$", printed, re.M).group(1)
        dashboard = re.search(rf"^\s+({re.escape(base)}/dashboard\?\S+)$", printed, re.M).group(1)
        assert "period=2026-11" in dashboard
        wait_for_port("127.0.0.1", port, timeout_s=60)
        with httpx.Client(base_url=base, timeout=30) as customer:
            assert _sign_in(customer, "/signin", "api_key", key).status_code == 200
            page = customer.get(dashboard)
            assert page.status_code == 200 and "cust-003" in page.text
            assert 'data-testid="invoices"' in page.text and "INV-2026-" in page.text
            assert 'data-testid="cp-balance"' in page.text  # spend against its prepaid credit
            assert customer.get(f"{base}/admin/finance").status_code == 403
            # the invoice on the page is the one the demo's invoices export (written at the billing step) has
            exported = {r["customer_id"]: r for r in csv.DictReader(open(home / "demo" / "invoices-2026-11.csv"))}
            [invoice] = customer.get(f"{base}/dashboard/invoices.json").json()["invoices"]
            assert (invoice["number"], invoice["total"], invoice["credits_applied"]) == (
                exported["cust-003"]["number"], exported["cust-003"]["total"], exported["cust-003"]["credits_applied"])
            # its prepaid credit as the demo billed it (as of the billing run, whatever the clock): 10.00 less
            # what the invoice used
            current = customer.get(f"{base}/dashboard/current-period.json?period=2026-11").json()
            assert Decimal(exported["cust-003"]["credits_applied"]) > 0
            assert Decimal(current["credit_balance"]) == Decimal("10.00") - Decimal(exported["cust-003"]["credits_applied"])
        with httpx.Client(base_url=base, timeout=30) as admin:
            finance = _sign_in(admin, "/admin/signin", "admin_token", admin_token)
            assert finance.status_code == 200
            assert "2026-11" in admin.get(f"{base}/admin/finance").text
            # the finance page's revenue by customer is the demo's revenue export summed per customer
            revenue: dict[str, Decimal] = {}
            for r in csv.DictReader(open(home / "demo" / "revenue-2026-11.csv")):
                revenue[r["customer_id"]] = revenue.get(r["customer_id"], Decimal(0)) + Decimal(r["net_amount"])
            shown = admin.get(f"{base}/admin/finance/data/revenue_customer.json?period=2026-11").json()["rows"]
            assert {r["customer_id"]: Decimal(r["net_amount"]) for r in shown} == revenue and len(revenue) > 10
        # the served demo is a working stack: an event posted to it is metered (its consumer runs while it serves)
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
        admin_auth = {"Authorization": f"Bearer {admin_token}"}
        posted = httpx.post(f"{base}/v1/events", content=request_event(1, customer=probe, at=at, input_tokens=321),
                            headers={**admin_auth, "Content-Type": "application/cloudevents+json"}, timeout=30)
        assert posted.status_code == 202, posted.text
        window = {"from": f"{at - timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}",
                  "to": f"{at + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}", "customer_id": probe}
        deadline = time.monotonic() + 60
        while not (rows := httpx.get(f"{base}/v1/usage", params=window, headers=admin_auth, timeout=30).json()["rows"]):
            assert time.monotonic() < deadline, "the event posted to the served demo was not metered within 60 s"
            time.sleep(0.5)
        assert [(r["customer_id"], r["requests"], r["input_tokens"]) for r in rows] == [(probe, 1, 321)]
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            code = demo.wait(90)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
        reader.join(10)
    assert code == 0, "".join(out)[-3000:]
    assert _left_behind(home) == {}
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_demo_serve_on_a_port_taken_says_so_in_one_line_before_any_work():
    home = Path(tempfile.mkdtemp(prefix="infermeter-demo-port-")) / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(INFERMETER_HOME=str(home))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--requests", "10", "--serve", "--port",
                               str(port)], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 (--port) is already in use: stop what listens there or set --port to a free port"
    ], done.stderr
    assert not (home / "pg").exists()
    assert _left_behind(home, wait_s=0) == {}
