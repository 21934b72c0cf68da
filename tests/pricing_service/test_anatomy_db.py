"""The cost anatomy on data written through the metering write path (BatchWriter, real PostgreSQL):
the engine state reaches the GPU ledger, the anatomy's total is `pricing compare`'s cost for the same
window, and every failure cause appears with its count."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from typer.testing import CliRunner

from infermeter.stack.postgres import to_libpq_url
from metering.contract import REQUEST_V1, encode_event, make_event, replica_event, task_event
from metering.kafka_types import Message
from metering.writer import BatchWriter
from pricing.anatomy import TERMS
from pricing.cost import CostModel
from pricing_service.anatomy import cost_anatomy, failure_report
from pricing_service.compare import default_book_paths, run_comparison
from pricing_service.source import connect

H0 = datetime(2026, 11, 2, tzinfo=UTC)
H1 = H0 + timedelta(hours=1)
NOW = datetime(2026, 11, 3, tzinfo=UTC)
MODEL = CostModel(gpu_hour={"H100": "2.50"}, prefill_weight="1", decode_weight="6", kv_cache_share="0.3")


class Writer:
    def __init__(self, db_url: str) -> None:
        self.writer = BatchWriter(to_libpq_url(db_url), group_id="anatomy-tests", max_bytes=65536,
                                  future_tolerance_s=300, clock=lambda: NOW)
        self.offsets = itertools.count()
        self.ids = itertools.count(1)

    def write(self, *events: dict) -> None:
        messages = [Message("events", 0, next(self.offsets), None, encode_event(e), {}, None) for e in events]
        assert self.writer.write(messages).accepted == len(events)

    def request(self, customer: str, minute: int, *, status: str = "ok", inp: int = 10_000, cached: int = 2_000,
                out: int = 500, replica: str = "r1", **extra) -> None:
        i = next(self.ids)
        at = H0 + timedelta(minutes=minute)
        tags = extra.pop("tags", {})
        data = {"request_id": f"r-{i}", "customer_id": customer, "model": "m1", "deployment_id": "dep-pool",
                "replica_id": replica, "status": status, "input_tokens": inp, "cached_input_tokens": cached,
                "output_tokens": out, "started_at": at - timedelta(seconds=2), "finished_at": at, "tags": tags, **extra}
        self.write(make_event(REQUEST_V1, source="//test/gw", subject=customer, event_id=f"r-{i}", time=at, data=data))


@pytest.fixture
def written(db_url: str) -> str:
    w = Writer(db_url)
    for replica in ("r1", "r2"):
        w.write(replica_event(source=f"//replica-agent/{replica}", replica_id=replica, deployment_id="dep-pool",
                              customer_id=None, gpu_type="H100", gpu_count=1, interval_start=H0, interval_end=H1,
                              busy_seconds="2880", prompt_tokens=0, generation_tokens=0, kv_cache_usage="0.5",
                              requests_waiting="0.5", requests_running="3"))
    w.request("cust-a", 1)
    w.request("cust-a", 2, cached=0, prefix_seen=True, prefix_seen_replica="r2")  # context not reused: residency
    w.request("cust-b", 7, prefix_seen=True, prefix_seen_replica="r1")  # seen, and the cache served 2,000: reused
    w.request("cust-a", 3, status="error", tags={"error": "upstream_broken"})
    w.request("cust-a", 4, status="cancelled", out=100, tags={"reason": "client_disconnected"})
    w.request("cust-b", 5, status="rejected", inp=0, cached=0, out=0, tags={"reason": "budget_exceeded"})
    w.request("cust-b", 6, upstream_attempts=3)  # two failover attempts (the gateway's field, when it sends it)
    w.request("cust-a", 10, task_id="t1", attempt=1)  # retried: the verifier did not accept it
    w.request("cust-a", 20, task_id="t1", attempt=2)
    w.request("cust-b", 30, task_id="t2", attempt=1)  # t2 failed, no cause given
    w.write(task_event(source="//agents", customer_id="cust-a", task_id="t1", outcome="succeeded",
                       finished_at=H0 + timedelta(minutes=25), failure_cause="verifier"),
            task_event(source="//agents", customer_id="cust-b", task_id="t2", outcome="failed",
                       finished_at=H0 + timedelta(minutes=35)))
    w.writer.close()
    return db_url


def test_engine_state_reaches_the_gpu_ledger(written):
    with psycopg.connect(to_libpq_url(written)) as conn:
        row = conn.execute("SELECT sum(gpu_ms), sum(busy_ms), sum(wall_ms), sum(kv_cache_gpu_ms), sum(queue_ms), "
                           "sum(running_ms) FROM gpu_ledger_hourly").fetchone()
        causes = conn.execute("SELECT task_id, failure_cause FROM task_outcomes ORDER BY 1").fetchall()
    assert row == (7_200_000, 5_760_000, 7_200_000, 3_600_000, 3_600_000, 21_600_000)
    assert causes == [("t1", "verifier"), ("t2", None)]


def test_anatomy_total_is_the_comparisons_cost_and_causes_are_counted(written, tmp_path):
    model_path = tmp_path / "cost.yaml"
    model_path.write_text('gpu_hour: {H100: "2.50"}\nprefill_weight: "1"\ndecode_weight: "6"\nkv_cache_share: "0.3"\n')
    report = run_comparison(written, H0, H1, default_book_paths(), model_path)
    with connect(written) as conn:
        by = {g: cost_anatomy(conn, H0, H1, MODEL, group_by=g) for g in ("deployment", "model", "customer")}
        failures = failure_report(conn, H0, H1, MODEL)
    for group, a in by.items():
        assert a.total == report.books[0].cost == Decimal("5.00"), group  # 2 GPU-hours at 2.50
        for r in a.rows:
            assert sum(getattr(r, t) for t in TERMS) == r.total
            assert all(getattr(r, t) >= 0 for t in TERMS)
    (pool,) = by["deployment"].rows
    # busy 80%: idle 20% ($1.00); KV memory-time 0.3 x 3,600,000 = 1,080,000 GPU-ms (15%, $0.75);
    # queue: (5,760,000 - 1,080,000) x 0.5 / 3.5 = 668,571.43 GPU-ms (~9.29%)
    assert pool.cache_occupancy == Decimal("0.75")
    assert pool.queue_and_idle == Decimal("1.46")  # 1.00 + 0.4643
    assert pool.new_compute > 0 and pool.context_not_reused > 0 and pool.failure > 0
    data = failures.to_json()
    counts = {c["cause"]: c["count"] for c in data["by_cause"]}
    assert failures.now.count("runtime") == 1  # the upstream error
    assert failures.now.count("client") == 1  # the cancelled request
    assert failures.now.count("capacity") == 1  # the rejected request
    assert failures.now.count("verifier") == 1  # t1's retried attempt
    assert failures.now.count("model") == 1  # t2's attempt (failed task)
    assert failures.now.count("routing", "failure") == 2  # upstream_attempts 3: two failover attempts
    assert failures.now.count("routing", "context_not_reused") == 1
    assert counts == {"runtime": 1, "capacity": 1, "routing": 3, "client": 1, "model": 1, "verifier": 1}
    assert data["previous_by_cause"][0]["cost"] == "0" and data["grew_most"]["cause"] in counts


def test_cost_commands_print_the_json(written, monkeypatch):
    from app.cli import _mount_optional_apps, app

    _mount_optional_apps()
    monkeypatch.setenv("DATABASE_URL", written)
    runner = CliRunner()
    result = runner.invoke(app, ["cost", "anatomy", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-02T01:00:00Z",
                                 "--group-by", "customer", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"currency", "total", "rows"}
    assert [r["key"] for r in data["rows"]] == ["cust-a", "cust-b"]
    assert set(data["rows"][0]) == {"key", *TERMS, "total"}
    assert sum(Decimal(r["total"]) for r in data["rows"]) == Decimal(data["total"])
    result = runner.invoke(app, ["cost", "failures", "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-02T01:00:00Z",
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert {c["cause"] for c in json.loads(result.stdout)["by_cause"]} >= {"runtime", "client", "capacity"}
