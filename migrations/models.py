"""Every table the migrations manage: each package registers its tables by being imported here."""

from __future__ import annotations

from sqlalchemy import MetaData

import alerts.tables  # noqa: F401
import billing_service.stripe.tables  # noqa: F401
import billing_service.tables  # noqa: F401
import dashboards.sessions  # noqa: F401
import metering.tables  # noqa: F401
import prediction_service.tables  # noqa: F401
import pricing_service.tables  # noqa: F401
import serving.tables  # noqa: F401
from infermeter.db import metadata


def target_metadata() -> MetaData:
    """The shared MetaData with every package's tables registered (Alembic, drift checks)."""
    return metadata
