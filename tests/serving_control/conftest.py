"""Fixtures of the serving-control tests: an engine on the per-test database."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine


@pytest.fixture
def engine(db_url: str):
    engine = create_engine(db_url, pool_size=10, max_overflow=20)
    yield engine
    engine.dispose()


@pytest.fixture
def other_engine(db_url: str):
    """A second engine on the same database: stands for a second gateway process's pool."""
    engine = create_engine(db_url, pool_size=10, max_overflow=20)
    yield engine
    engine.dispose()
