"""RPM and TPM limits hold across gateway processes (shared through Postgres)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from serving import ratelimit
from serving.budgets import AdmissionController, Admitted, Rejected, set_budget
from serving.ratelimit import WindowCount

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 15, 12, 0, 15, tzinfo=UTC)


def _two_processes(db_url: str, customer: str, count: int, prompt: int, max_tokens: int) -> list[tuple[int, str]]:
    start_at = time.time() + 2.0
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.serving_control.admit_child", db_url, customer, NOW.isoformat(),
             str(count), str(prompt), str(max_tokens), str(start_at)],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    out = []
    for process in processes:
        stdout, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        admitted, reasons = stdout.strip().split(" ")
        out.append((int(admitted.split("=")[1]), reasons.split("=")[1]))
    return out


def test_rpm_holds_across_two_processes(engine, db_url):
    set_budget(engine, "cust-rpm", rpm=20)
    results = _two_processes(db_url, "cust-rpm", 30, 10, 10)
    assert sum(a for a, _ in results) == 20
    assert {r for _, r in results} == {"rate_limit_requests"}


def test_tpm_holds_across_two_processes_and_settlement_corrects_it(engine, db_url, settings):
    set_budget(engine, "cust-tpm", tpm=10_000)
    results = _two_processes(db_url, "cust-tpm", 15, 500, 500)  # 1000 tokens worst case each
    assert sum(a for a, _ in results) == 10
    assert {r for _, r in results} == {"rate_limit_tokens"}
    # a request settled for fewer tokens than its worst case gives the rest back to the window
    ctl = AdmissionController(engine, settings, clock=lambda: NOW)
    set_budget(engine, "cust-tpm2", tpm=2_000)
    first = ctl.admit_sync("cust-tpm2", model="tiny", request_id="a", prompt_tokens=500, max_tokens=500, now=NOW)
    second = ctl.admit_sync("cust-tpm2", model="tiny", request_id="b", prompt_tokens=500, max_tokens=500, now=NOW)
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    assert isinstance(ctl.admit_sync("cust-tpm2", model="tiny", request_id="c", prompt_tokens=500,
                                     max_tokens=500, now=NOW), Rejected)
    ctl.settle_sync("a", input_tokens=500, cached_input_tokens=0, output_tokens=0, event_source="s", event_id="a")
    assert isinstance(ctl.admit_sync("cust-tpm2", model="tiny", request_id="d", prompt_tokens=400,
                                     max_tokens=100, now=NOW), Admitted)


def test_rate_limited_rejection_is_openai_shaped_with_retry_after(engine, settings):
    set_budget(engine, "cust-r", rpm=1)
    ctl = AdmissionController(engine, settings)
    assert isinstance(ctl.admit_sync("cust-r", model="m", request_id="1", prompt_tokens=1, max_tokens=1, now=NOW), Admitted)
    rejection = ctl.admit_sync("cust-r", model="m", request_id="2", prompt_tokens=1, max_tokens=1, now=NOW)
    assert isinstance(rejection, Rejected)
    assert (rejection.status, rejection.error_type, rejection.reason) == (429, "rate_limit_exceeded", "rate_limit_requests")
    assert rejection.headers["Retry-After"] == "45"
    assert rejection.openai_error()["error"]["code"] == "rate_limit_exceeded"
    # two minutes later the window is free again
    later = NOW + timedelta(minutes=2)
    assert isinstance(ctl.admit_sync("cust-r", model="m", request_id=uuid.uuid4().hex, prompt_tokens=1,
                                     max_tokens=1, now=later), Admitted)


def test_sliding_window_weights_the_previous_minute():
    start = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    quarter = start + timedelta(seconds=15)
    assert ratelimit.sliding_estimate(40, 0, quarter) == 30.0
    decision = ratelimit.check(30, None, WindowCount(40, 0), WindowCount(0, 0), quarter, 1)
    assert not decision.allowed  # 30 + 1 > 30
    assert ratelimit.check(31, None, WindowCount(40, 0), WindowCount(0, 0), quarter, 1).allowed
    too_big = ratelimit.check(None, 100, WindowCount(), WindowCount(), quarter, 101)
    assert not too_big.allowed and "too large" in too_big.message.lower()


def test_budget_cap_holds_across_two_processes(engine, db_url):
    """Same lock, real processes: default list prices, worst case 1000 x 0.50/M + 500 x 1.50/M."""
    from decimal import Decimal

    set_budget(engine, "cust-cap", monthly_cap=Decimal("0.025"), mode="hard")  # 20 worst cases of 0.00125
    results = _two_processes(db_url, "cust-cap", 30, 1000, 500)
    assert sum(a for a, _ in results) == 20
    assert {r for _, r in results} == {"budget_exceeded"}
