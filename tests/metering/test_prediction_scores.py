"""Admission-time predictions are scored at ingest, once per event (metering.prediction_scores)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg

from metering.contract import encode_event, request_event
from metering.kafka_types import Message
from metering.prediction_scores import FAILED_STATUSES, UNSCORED_STATUSES, scores
from metering.writer import BatchWriter
from prediction.request import FAILED_STATUSES as PREDICTION_FAILED_STATUSES
from prediction.request import NOT_LEARNED_STATUSES
from tests.metering.conftest import dsn, meter, snapshot

AT = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 29, tzinfo=UTC)


def _predicted(i: int, *, output: int, status: str = "ok", customer: str = "cust-a", model: str = "m1",
               at: datetime = AT, prediction: dict | None = None, input_tokens: int = 100, cached: int = 40) -> bytes:
    at = at + timedelta(seconds=i)
    return encode_event(request_event(
        source="//test/gw", request_id=f"p-{i}", customer_id=customer, model=model, deployment_id="d1",
        status=status, input_tokens=input_tokens, cached_input_tokens=cached, output_tokens=output,
        started_at=at - timedelta(seconds=1), finished_at=at, prediction=prediction))


def _prediction(p50: int, p90: int, p99: int, cached: float = 0.5, failure: float = 0.1) -> dict:
    return {"model_version": 2, "output_tokens_p50": p50, "output_tokens_p90": p90, "output_tokens_p99": p99,
            "cached_fraction": cached, "failure_probability": failure}


def _stream() -> list[bytes]:
    """Three scored requests of cust-a on m1 in one hour, one of them failed; one unscored each way
    (no prediction, a rejected request, an explicit null); one scored of cust-b in the next hour."""
    return [
        # output 50 under p50 60: |e| 10, pinball90 0.1*(90-50)=4, pinball99 0.01*(200-50)=1.5, cached |0.4-0.5|
        _predicted(1, output=50, prediction=_prediction(60, 90, 200)),
        # output 120 above p90 100 and under p99 150: |e| 20, 0.9*20=18, 0.01*30=0.3
        _predicted(2, output=120, prediction=_prediction(100, 100, 150, cached=0.4, failure=0.25)),
        # failed (error), output 300 above p99 250: |e| 290, 0.9*(300-40)=234, 0.99*(300-250)=49.5; cached 0
        _predicted(3, output=300, status="error", input_tokens=0, cached=0,
                   prediction=_prediction(10, 40, 250, cached=0.3, failure=0.8)),
        _predicted(4, output=70),  # no prediction: not scored
        _predicted(5, output=0, status="rejected", prediction=_prediction(60, 90, 200)),  # never ran: not scored
        _predicted(6, output=5, prediction=None),
        _predicted(7, output=80, customer="cust-b", model="m2", at=AT + timedelta(hours=1),
                   prediction=_prediction(80, 100, 120, cached=0.4, failure=0)),
    ]


EXPECTED = {
    # requests, failures, abs_error_p50, under_p90, under_p99, pinball_p90, pinball_p99, cached, brier
    ("cust-a", "m1"): (3, 1, 10 + 20 + 290, 1, 2, Decimal("4") + 18 + 234, Decimal("1.5") + Decimal("0.3") + Decimal("49.5"),
                       Decimal("0.1") + Decimal("0") + Decimal("0.3"),
                       Decimal("0.01") + Decimal("0.0625") + Decimal("0.04")),
    ("cust-b", "m2"): (1, 0, 0, 1, 1, Decimal("2"), Decimal("0.4"), Decimal(0), Decimal(0)),  # 0.1*20, 0.01*40
}


def _sums(settings) -> dict:
    with psycopg.connect(dsn(settings)) as conn:
        return {(s.customer_id, s.model): (s.requests, s.failures, s.abs_error_p50, s.under_p90, s.under_p99,
                                           s.pinball_p90, s.pinball_p99, s.abs_error_cached_fraction, s.brier_failure)
                for s in scores(conn, AT, AT + timedelta(days=1))}


def test_each_prediction_is_scored_once_even_when_its_event_is_delivered_twice(settings):
    lines = _stream()
    first = meter(settings, lines)
    assert (first.accepted, first.rejected) == (len(lines), 0)
    assert _sums(settings) == EXPECTED
    reference = snapshot(settings)
    again = meter(settings, lines + lines[:3])  # the whole stream again, and some of it twice in one delivery
    assert (again.accepted, again.duplicates) == (0, len(lines) + 3)
    assert _sums(settings) == EXPECTED
    assert snapshot(settings) == reference


def test_a_replayed_or_moved_batch_adds_no_score(settings):
    writer = BatchWriter(dsn(settings), group_id="g1", max_bytes=65536, future_tolerance_s=300, clock=lambda: NOW)
    lines = _stream()
    batch = [Message("events", 0, i, None, line, {}, None) for i, line in enumerate(lines)]
    assert writer.write(batch).accepted == len(lines)
    assert writer.write(batch).skipped == len(lines)  # same offsets: fenced off
    moved = writer.write([Message("events", 1, i, None, line, {}, None) for i, line in enumerate(lines)])
    assert (moved.accepted, moved.duplicates) == (0, len(lines))
    writer.close()
    assert _sums(settings) == EXPECTED


def test_a_window_sums_the_hours_that_start_in_it(settings):
    meter(settings, _stream())
    with psycopg.connect(dsn(settings)) as conn:
        assert [s.customer_id for s in scores(conn, AT, AT + timedelta(hours=1))] == ["cust-a"]
        assert [s.customer_id for s in scores(conn, AT + timedelta(hours=1), AT + timedelta(hours=2))] == ["cust-b"]
        assert scores(conn, AT - timedelta(hours=1), AT) == []


def test_failures_and_unscored_statuses_are_the_predictors_own():
    assert frozenset(FAILED_STATUSES) == PREDICTION_FAILED_STATUSES
    assert frozenset(UNSCORED_STATUSES) == NOT_LEARNED_STATUSES
