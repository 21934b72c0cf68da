"""Fixtures of the Kafka contract suite: every test runs once per client backend, on the real broker."""

from __future__ import annotations

import uuid

import pytest

from metering import kafka as mk


@pytest.fixture(params=mk.BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def topic(kafka_bootstrap: str, backend: str) -> str:
    """A fresh 4-partition topic (unique per test: Tansu keeps everything in memory for the session)."""
    name = f"contract-{uuid.uuid4().hex[:10]}"
    mk.create_topic(kafka_bootstrap, name, 4, backend=backend)
    return name


@pytest.fixture
def group_id() -> str:
    # A unique group per test: a Tansu group can stay stuck after a crash plus a quick join/leave.
    return f"contract-{uuid.uuid4().hex[:10]}"
