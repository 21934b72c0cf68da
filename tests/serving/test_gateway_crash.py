"""kill -9 of a gateway process with usage events still spooled (Kafka unreachable): after a
restart on the same spool every event reaches metering exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

from infermeter.stack.ports import free_port

REQUESTS = 12


def _start_gateway(pipeline, vllm, home: Path, bootstrap: str, port: int, log: Path) -> subprocess.Popen:
    upstreams = home / "upstreams.yaml"
    upstreams.write_text(
        "models:\n  - name: tiny-llama\n    deployment_id: tiny-cpu\n"
        f"    replicas:\n      - {{id: tiny-cpu-0, url: {vllm.url}}}\n"
    )
    env = {
        **os.environ,
        "INFERMETER_HOME": str(home),
        "DATABASE_URL": pipeline.database_url,
        "KAFKA_BOOTSTRAP": bootstrap,
        "INFERMETER_TOPIC_PREFIX": pipeline.settings.topic_prefix,
        "INFERMETER_GATEWAY_ID": "crash-test",
        "INFERMETER_UPSTREAMS": str(upstreams),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "gateway", "--port", str(port)],
        env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return process
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gateway did not start:\n" + log.read_text())


def _spool_depth(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("infermeter_emitter_spool_depth{"):
                return float(line.rsplit(" ", 1)[1])
    return -1.0


def test_kill_9_with_spooled_events_loses_and_doubles_nothing(pipeline, vllm, customer, tmp_path):
    home = tmp_path / "gateway-home"
    home.mkdir()
    port = free_port()
    dead_kafka = f"127.0.0.1:{free_port()}"  # nothing listens: every event stays in the spool
    first = _start_gateway(pipeline, vllm, home, dead_kafka, port, tmp_path / "gateway.log")
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {customer.token}"},
            timeout=60,
        ) as http:
            for n in range(REQUESTS):
                body = {
                    "model": "tiny-llama",
                    "prompt": f"crash {n}",
                    "max_tokens": 2,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": n % 2 == 0,
                }
                assert http.post("/v1/completions", json=body).status_code == 200
        assert _spool_depth(port) == REQUESTS
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    assert pipeline.rows(
        "SELECT count(*) FROM raw_events WHERE customer_id = %s", (customer.customer_id,)
    ) == [(0,)]

    second = _start_gateway(
        pipeline, vllm, home, pipeline.settings.kafka_bootstrap, port, tmp_path / "gateway.log"
    )
    try:
        events = pipeline.request_events(customer.customer_id, REQUESTS, timeout_s=60)
        pipeline.settle(1.5)
        events = pipeline.request_events(customer.customer_id, REQUESTS)
        assert len(events) == REQUESTS
        assert len({event["id"] for event in events}) == REQUESTS
        assert all(
            event["data"]["status"] == "ok" and event["data"]["output_tokens"] == 2 for event in events
        )
        deadline = time.monotonic() + 20
        while _spool_depth(port) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _spool_depth(port) == 0
    finally:
        second.terminate()
        second.wait(20)
