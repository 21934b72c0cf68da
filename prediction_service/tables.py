"""The predictors' table (SQLAlchemy Core); Alembic revision 0014 creates exactly it.

- `prediction_fits`: one row per fit, append-only. `version` numbers the fits (the newest is in
  force); the window [window_start, window_end) of metered history it was fitted on, when, how many
  request events and finished tasks it learned from, what started it (`cli`, `schedule`), its CPU
  time, and the fitted state: `{"requests": RequestModel.to_state(), "tasks": TaskModel.to_state()}`
  (each with its own format number).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

from infermeter.db import metadata, timestamp_column

prediction_fits = Table(
    "prediction_fits",
    metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=True),
    timestamp_column("window_start", nullable=False),
    timestamp_column("window_end", nullable=False),
    timestamp_column("fitted_at", nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("tasks", BigInteger, nullable=False),
    Column("fit_cpu_ms", BigInteger, nullable=False),
    Column("trigger", Text, nullable=False),
    Column("state", JSONB, nullable=False),
)
Index("prediction_fits_fitted_at", prediction_fits.c.fitted_at)
