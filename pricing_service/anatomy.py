"""`infermeter cost anatomy|failures`: load a window (and the GPU ledger's engine state and the raw
request events' classes, `metering.anatomy_reads`) and divide its GPU cost (`pricing.anatomy`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import psycopg

from infermeter.times import utc_text
from metering import anatomy_reads
from pricing.anatomy import (
    Anatomy,
    AnatomyInputs,
    EngineRecord,
    Failures,
    RequestClassRecord,
    anatomy,
    failures,
    grew_most,
    parts,
)
from pricing.cost import CostModel
from pricing.records import Dataset
from pricing_service.rate_period import gc_paused
from pricing_service.source import check_window, load_dataset


def load_anatomy_inputs(conn: psycopg.Connection, start: datetime, end: datetime) -> AnatomyInputs:
    engine = tuple(EngineRecord(d, h, Decimal(busy), kv, q, r)
                   for d, h, busy, kv, q, r in anatomy_reads.engine_hours(conn, start, end))
    classes = tuple(RequestClassRecord(*row) for row in anatomy_reads.request_classes(conn, start, end))
    return AnatomyInputs(engine, classes)


def load_parts(conn: psycopg.Connection, start: datetime, end: datetime, cost_model: CostModel,
               dataset: Dataset | None = None) -> list:
    start, end = check_window(start, end)
    dataset = dataset or load_dataset(conn, start, end)
    inputs = load_anatomy_inputs(conn, start, end)
    with gc_paused():
        return parts(dataset, cost_model, inputs)


def cost_anatomy(conn: psycopg.Connection, start: datetime, end: datetime, cost_model: CostModel, *,
                 group_by: str = "deployment", deployment: str | None = None) -> Anatomy:
    all_parts = load_parts(conn, start, end, cost_model)
    with gc_paused():
        return anatomy(all_parts, cost_model.currency, group_by=group_by, deployment=deployment)


@dataclass(frozen=True)
class FailureReport:
    start: datetime
    end: datetime
    now: Failures
    before: Failures  # the previous window of equal length

    def to_json(self) -> dict:
        def by_cause(f: Failures) -> list[dict]:
            return [{"cause": c, "cost": str(cost), "count": n} for c, (cost, n) in f.by_cause().items()]

        grew = grew_most(self.now, self.before)
        return {
            "currency": self.now.currency,
            "window": {"from": utc_text(self.start), "to": utc_text(self.end)},
            "previous_window": {"from": utc_text(self.start - (self.end - self.start)), "to": utc_text(self.start)},
            "by_cause": by_cause(self.now),
            "previous_by_cause": by_cause(self.before),
            "rows": [{"cause": r.cause, "kind": r.kind, "model": r.model, "customer_id": r.customer_id,
                      "cost": str(r.cost), "count": r.count} for r in self.now.rows],
            "grew_most": None if grew is None else {"cause": grew[0], "by": str(grew[1])},
        }


def failure_report(conn: psycopg.Connection, start: datetime, end: datetime, cost_model: CostModel) -> FailureReport:
    start, end = check_window(start, end)
    previous = start - (end - start)
    now = failures(load_parts(conn, start, end, cost_model), cost_model.currency)
    before = failures(load_parts(conn, previous, start, cost_model), cost_model.currency)
    return FailureReport(start, end, now, before)
