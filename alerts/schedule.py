"""Alerts inside `infermeter up`: every INFERMETER_ALERT_INTERVAL_S the thresholds are evaluated and
what crossed is sent (the first time at start-up); in between, deliveries are retried as they fall due
(the backoff of `alerts.delivery.Policy`). 0 turns it off. A failed round is logged and the next one
runs as planned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

import psycopg

from alerts import delivery
from alerts.evaluate import default_thresholds, evaluate
from infermeter.periodic import Periodic
from infermeter.settings import Settings
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import utc_now

log = logging.getLogger(__name__)


class AlertSchedule(Periodic):
    thread_name = "alerts"

    def __init__(self, settings: Settings, database_url: str, *, clock: Callable[[], datetime] = utc_now,
                 budgets_factory: Callable[[], object] | None = None, cost_model=None) -> None:
        super().__init__()
        self.settings = settings
        self.interval_s = settings.alert_interval_s
        self.database_url = database_url
        self.defaults = default_thresholds(settings)  # a malformed setting stops `up` at start, not later
        self.policy = delivery.Policy.of(settings)
        self.clock = clock
        self.budgets_factory = budgets_factory or self._serving_budgets
        self.cost_model = cost_model
        self.rounds = 0

    def _serving_budgets(self):
        from prediction_service.budgets import ServingBudgets

        return ServingBudgets(self.database_url, self.settings)

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(to_libpq_url(self.database_url), autocommit=True)
        conn.execute("SET TIME ZONE 'UTC'")
        return conn

    def evaluate_once(self) -> list:
        """Evaluate every customer now and send what is due; [] (logged) if the round failed."""
        try:
            with self._connect() as conn:
                budgets = self.budgets_factory()
                try:
                    fired = evaluate(conn, now=self.clock(), defaults=self.defaults, budgets=budgets,
                                     cost_model=self._cost_model())
                finally:
                    close = getattr(budgets, "close", None)
                    if close is not None:
                        close()
                delivery.deliver_due(conn, self.policy, now=self.clock(), clock=self.clock)
        except Exception:  # the schedule keeps going; the next interval tries again
            log.exception("evaluating alerts failed")
            return []
        self.rounds += 1
        new = [f for f in fired if f.new]
        if new:
            log.info("alerts fired: %s", ", ".join(f"{f.crossing.customer_id} {f.crossing.kind} "
                                                   f"{f.crossing.threshold}" for f in new))
        return fired

    def _cost_model(self):
        if self.cost_model is None:
            from pricing_service.books import read_cost_model

            self.cost_model = read_cost_model(self.settings.pricing_cost_model)
        return self.cost_model

    def deliver_once(self) -> float | None:
        """Send the deliveries due now; seconds until the next one is due (None: none pending)."""
        try:
            with self._connect() as conn:
                delivery.deliver_due(conn, self.policy, now=self.clock(), clock=self.clock)
                due = delivery.next_due(conn)
        except Exception:
            log.exception("sending alert webhooks failed")
            return None
        return None if due is None else max(0.0, (due - self.clock()).total_seconds())

    def _run(self) -> None:
        next_round = time.monotonic()
        while not self.stop_event.is_set():
            if time.monotonic() >= next_round:
                self.evaluate_once()
                next_round = time.monotonic() + self.interval_s
            due = self.deliver_once()  # retries fall due between rounds
            until_round = next_round - time.monotonic()
            self.stop_event.wait(max(0.05, until_round if due is None else min(due, until_round)))

