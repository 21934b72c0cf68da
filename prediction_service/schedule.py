"""The refit schedule inside `infermeter up`: every INFERMETER_PREDICT_REFIT_INTERVAL_S the predictors
are fitted again on the INFERMETER_PREDICT_WINDOW_DAYS before the current hour (0 turns it off).

The first fit runs at start-up; a failed fit is logged and the next one runs at the next interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from infermeter.periodic import Periodic
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import floor_hour
from prediction_service import store

log = logging.getLogger(__name__)


def default_window(now: datetime, days: int) -> tuple[datetime, datetime]:
    """The `days` whole days before the current hour."""
    end = floor_hour(now)
    return end - timedelta(days=days), end


class RefitSchedule(Periodic):
    thread_name = "predict-refit"

    def __init__(self, settings: Settings, database_url: str, *, clock: Callable[[], datetime] | None = None) -> None:
        super().__init__()
        self.interval_s = settings.predict_refit_interval_s
        self.window_days = settings.predict_window_days
        self.database_url = database_url
        self.clock = clock or (lambda: datetime.now(UTC))
        self.fits = 0

    def fit_once(self) -> store.FitInfo | None:
        now = self.clock()
        start, end = default_window(now, self.window_days)
        try:
            with psycopg.connect(to_libpq_url(self.database_url)) as conn:
                info = store.fit(conn, start, end, now=now, trigger="schedule")
        except Exception:  # the schedule keeps going; the next interval tries again
            log.exception("refitting the predictors failed")
            return None
        self.fits += 1
        log.info("predictors fitted: version %s on %s requests", info.version, info.requests)
        return info

    def _run(self) -> None:
        while not self.stop_event.is_set():
            self.fit_once()
            self.stop_event.wait(self.interval_s)

