"""Models and migrations do not drift: autogenerate against a migrated database finds nothing."""

from infermeter.db import drift


def test_models_and_migrations_agree(db_url):
    assert drift(db_url) == []
