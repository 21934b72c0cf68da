"""The anatomy's small pieces worked by hand: what a class of requests is (cause, weighted tokens,
units), who caused a cancellation, a deployment-hour's fractions (which always add up to 1), the
failure rows' order, and the anatomy as JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from pricing.anatomy import (
    Anatomy,
    AnatomyRow,
    Part,
    RequestClassRecord,
    _fractions,
    classify,
    failures,
    request_cause,
)
from pricing.cost import CostModel

D = Decimal
H = datetime(2026, 11, 2, 10, tzinfo=UTC)
MODEL = CostModel(gpu_hour={"h100": D("3.60")}, prefill_weight=D(2), decode_weight=D(3))


def record(**changes) -> RequestClassRecord:
    fields = dict(customer_id="c", model="m", deployment_id="d", hour=H, status="ok", requests=4,
                  uncached_input_tokens=100, output_tokens=10)
    fields.update(changes)
    return RequestClassRecord(**fields)


# prefill 2 x 100 = 200, decode 3 x 10 = 30
@pytest.mark.parametrize(
    ("changes", "classes"),
    [({}, [("new_compute", "", D(230), 4)]),
     ({"prefix": "same"}, [("context_not_reused", "capacity", D(200), 4), ("new_compute", "", D(30), 0)]),
     ({"prefix": "other"}, [("context_not_reused", "routing", D(200), 4), ("new_compute", "", D(30), 0)]),
     ({"failovers": 2}, [("new_compute", "", D(230), 4), ("failure", "routing", D(400), 8)]),
     ({"failovers": 0}, [("new_compute", "", D(230), 4)]),
     ({"status": "error"}, [("failure", "runtime", D(230), 4)])],
)
def test_a_class_of_requests_by_hand(changes, classes):
    assert classify(record(**changes), MODEL) == classes


@pytest.mark.parametrize(
    ("status", "error", "reason", "cause"),
    [("cancelled", "", "server_shutdown", "runtime"), ("cancelled", "", "", "client"),
     ("cancelled", "", "client_disconnected", "client"), ("error", "", "", "runtime"),
     ("error", "queue_timeout", "", "capacity"), ("rejected", "", "residency", "routing")],
)
def test_who_caused_a_failed_request(status, error, reason, cause):
    assert request_cause(status, error, reason) == cause


@pytest.mark.parametrize(
    ("gpu_ms", "engine", "fractions"),
    [(0, None, (D(0), D(0), D(1))),  # no GPU time: nothing to divide
     (1000, None, (D(0), D(0), D(1))),  # nothing known of the engine: all token work
     # busy 800 of 1000, cache 0.5 x 200 = 100, queue half of the rest (300 of 600 ms): 350 queued, 350 tokens
     (1000, [D(800), D(200), D(300), D(300)], (D("0.55"), D("0.1"), D("0.35"))),
     # no queue and nothing running: nothing queued
     (1000, [D(800), D(200), D(0), D(0)], (D("0.2"), D("0.1"), D("0.7")))],
)
def test_a_deployment_hours_fractions_add_up_to_one(gpu_ms, engine, fractions):
    got = _fractions(gpu_ms, engine, D("0.5"))
    assert got == fractions and sum(got) == 1


def test_failure_rows_are_ordered_by_cause_then_kind_then_model():
    parts = [Part("c", "a", "d", H, "failure", "routing", D("1.00"), 1),
             Part("c", "b", "d", H, "context_not_reused", "routing", D("2.00"), 1),
             Part("c", "a", "d", H, "failure", "runtime", D("0.50"), 1)]
    rows = failures(parts, "USD").rows
    assert [(r.cause, r.kind, r.model, r.cost) for r in rows] == [
        ("runtime", "failure", "a", D("0.50")), ("routing", "context_not_reused", "b", D("2.00")),
        ("routing", "failure", "a", D("1.00"))]


def test_an_anatomy_as_json():
    row = AnatomyRow("d", D("1.00"), D("0.10"), D("0.20"), D("0.30"), D("0.40"))
    assert row.to_json() == {"key": "d", "new_compute": "1.00", "context_not_reused": "0.10",
                             "cache_occupancy": "0.20", "queue_and_idle": "0.30", "failure": "0.40", "total": "2.00"}
    whole = Anatomy("USD", "deployment", (row,))
    assert whole.to_json() == {"currency": "USD", "group_by": "deployment", "total": "2.00", "rows": [row.to_json()]}
    empty = Anatomy("USD", "model", ())
    assert (empty.term("failure"), empty.to_json()["total"]) == (D(0), "0")
    assert isinstance(empty.term("failure"), Decimal)
