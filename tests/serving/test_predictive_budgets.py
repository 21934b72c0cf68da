"""The predictive budget mode at the budget's edge, on PostgreSQL: a replay of 100 concurrent requests
admitted and settled through the real AdmissionController, once in hard mode and once in predictive
mode (the reservation is the request's predicted p99 output, from a fitted prediction.RequestModel),
against the same cap. Predictive refuses fewer requests; its overshoot stays inside the bound stated in
serving/budgets.py and docs/serving.md; hard mode still never passes the cap."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from infermeter.db import get_engine
from infermeter.settings import Settings
from prediction.request import RequestFeatures, RequestObservation, fit_requests
from serving.budgets import (
    MODES,
    AdmissionController,
    Admitted,
    Rejected,
    list_price,
    reservation_output_tokens,
    set_budget,
)
from tests.serving_control.test_budgets import NOW, PRICES  # the budget tests' clock and list prices

MODEL, PROMPT, MAX_TOKENS = "tiny", 1000, 500
CONCURRENCY = 100
WAVES = 3
CAP = Decimal("0.15")  # 75 worst cases (0.002 each): the replay's demand is about 2.6 times the cap


@pytest.fixture
def engine(db_url: str):
    """The project's engine (10 connections; admissions of one customer queue on its row lock anyway)."""
    yield (engine := get_engine(db_url))
    engine.dispose()


@pytest.fixture
def budget_settings(db_url: str, tmp_path) -> Settings:
    return Settings(INFERMETER_HOME=tmp_path / "home", DATABASE_URL=db_url).model_copy(update=PRICES)


def _outputs(seed: int, n: int) -> list[int]:
    """Output tokens of a customer's requests: log-normal around 90 tokens, at most MAX_TOKENS."""
    rng = random.Random(seed)
    return [min(MAX_TOKENS, max(1, round(rng.lognormvariate(4.5, 0.5)))) for _ in range(n)]


def _predicted_p99(customer: str) -> int:
    """The p99 the gateway would reserve: a RequestModel fitted on 2,000 earlier requests of the customer."""
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    history = [RequestObservation("//test/gw", f"h-{i}", customer, MODEL, "ok", PROMPT, 0, out,
                                  t0 + timedelta(minutes=i), t0 + timedelta(minutes=i, seconds=5), max_tokens=MAX_TOKENS)
               for i, out in enumerate(_outputs(1, 2000))]
    model = fit_requests(history)
    return model.predict_request(RequestFeatures(customer, MODEL, PROMPT, MAX_TOKENS)).output_tokens_p99


def _replay(engine, settings, customer: str, mode: str, outputs: list[int], p99: int) -> tuple[int, Decimal, int]:
    """WAVES waves of CONCURRENCY requests, each wave admitted all at once (a barrier: every admitted
    request of the wave is in flight together), then settled to its actual output. Returns (refused,
    the month's spend after the replay, the most requests in flight at once)."""
    set_budget(engine, customer, monthly_cap=CAP, mode=mode)
    ctl = AdmissionController(engine, settings, clock=lambda: NOW)
    refused = 0
    most_in_flight = 0
    try:
        for wave in range(WAVES):
            barrier = threading.Barrier(CONCURRENCY)
            results: dict[int, Admitted | Rejected] = {}

            def admit(i: int, wave: int = wave, barrier: threading.Barrier = barrier, results=results) -> None:
                barrier.wait()
                results[i] = ctl.admit_sync(customer, model=MODEL, request_id=f"{customer}-{wave}-{i}",
                                            prompt_tokens=PROMPT, max_tokens=MAX_TOKENS, predicted_output_tokens=p99,
                                            now=NOW)

            threads = [threading.Thread(target=admit, args=(i,)) for i in range(CONCURRENCY)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert len(results) == CONCURRENCY
            admitted = [i for i, r in results.items() if isinstance(r, Admitted)]
            refused += sum(isinstance(r, Rejected) for r in results.values())
            assert {r.reason for r in results.values() if isinstance(r, Rejected)} <= {"budget_exceeded"}
            most_in_flight = max(most_in_flight, len(admitted))
            for i in admitted:
                ctl.settle_sync(f"{customer}-{wave}-{i}", input_tokens=PROMPT, cached_input_tokens=0,
                                output_tokens=outputs[wave * CONCURRENCY + i], event_source="//test/gw",
                                event_id=f"{customer}-{wave}-{i}", now=NOW)
        spend = ctl.spend(customer, now=NOW)
        assert spend.reserved == 0
        return refused, spend.total, most_in_flight
    finally:
        ctl.close()


def _bound(in_flight: int, p99: int, settings: Settings) -> Decimal:
    """docs/serving.md: overshoot <= C x (max_tokens - p99) x output price."""
    return in_flight * (MAX_TOKENS - reservation_output_tokens("predictive", MAX_TOKENS, p99)) * list_price(
        MODEL, settings).output


def test_predictive_refuses_fewer_than_the_worst_case_and_overshoots_within_the_bound(engine, budget_settings):
    assert "predictive" in MODES
    p99 = _predicted_p99("cust-pred")
    assert 100 < p99 < MAX_TOKENS  # the replay's outputs are inside max_tokens, well below it
    outputs = _outputs(2, WAVES * CONCURRENCY)  # the same replay for both modes
    hard_refused, hard_spend, _ = _replay(engine, budget_settings, "cust-hard", "hard", outputs, p99)
    pred_refused, pred_spend, in_flight = _replay(engine, budget_settings, "cust-pred", "predictive", outputs, p99)

    assert hard_spend <= CAP  # hard mode keeps its promise: never past the cap
    assert hard_refused > 0 and pred_refused > 0  # the replay is at the edge for both
    assert pred_refused < hard_refused  # (a) fewer refused than the worst-case reservation
    overshoot = max(pred_spend - CAP, Decimal(0))
    assert in_flight <= CONCURRENCY
    assert overshoot <= _bound(in_flight, p99, budget_settings)  # (b) within the stated bound
    assert overshoot <= _bound(CONCURRENCY, p99, budget_settings)


def test_the_bound_is_reached_only_when_every_request_in_flight_runs_to_max_tokens(engine, budget_settings):
    """The adversarial case: every admitted request of a single wave of 100 produces max_tokens. The
    overshoot is then exactly the sum over them of (max_tokens - reserved output) x output price,
    minus the room the last admission left: inside the bound, and close to it."""
    p99 = _predicted_p99("cust-worst")
    outputs = [MAX_TOKENS] * (WAVES * CONCURRENCY)
    _, spend, in_flight = _replay(engine, budget_settings, "cust-worst", "predictive", outputs, p99)
    bound = _bound(in_flight, p99, budget_settings)
    overshoot = spend - CAP
    assert 0 < overshoot <= bound
    reserved = list_price(MODEL, budget_settings).cost(uncached_input_tokens=PROMPT, cached_input_tokens=0,
                                                       output_tokens=p99)
    assert bound - overshoot < reserved  # the slack is less than one more reservation: the bound is tight


def test_without_a_prediction_predictive_reserves_max_tokens_like_hard(engine, budget_settings):
    set_budget(engine, "cust-nofit", monthly_cap=Decimal("0.004"), mode="predictive")
    ctl = AdmissionController(engine, budget_settings, clock=lambda: NOW)
    try:
        first = ctl.admit_sync("cust-nofit", model=MODEL, request_id="n1", prompt_tokens=PROMPT, max_tokens=MAX_TOKENS,
                               now=NOW)
        assert isinstance(first, Admitted) and first.reserved == Decimal("0.002")  # the worst case
        predicted = ctl.admit_sync("cust-nofit", model=MODEL, request_id="n2", prompt_tokens=PROMPT,
                                   max_tokens=MAX_TOKENS, predicted_output_tokens=100, now=NOW)
        assert isinstance(predicted, Admitted) and predicted.reserved == Decimal("0.0012")
        # a prediction above max_tokens is capped at it; 0.002 + 0.0012 + 0.002 > 0.004: refused (402)
        over = ctl.admit_sync("cust-nofit", model=MODEL, request_id="n3", prompt_tokens=PROMPT,
                              max_tokens=MAX_TOKENS, predicted_output_tokens=10_000, now=NOW)
        assert isinstance(over, Rejected) and over.status == 402
    finally:
        ctl.close()


@pytest.mark.parametrize(("mode", "predicted", "expected"), [
    ("hard", 100, MAX_TOKENS), ("soft", 100, MAX_TOKENS), ("predictive", None, MAX_TOKENS),
    ("predictive", 100, 100), ("predictive", MAX_TOKENS, MAX_TOKENS), ("predictive", MAX_TOKENS + 1, MAX_TOKENS),
    ("predictive", 0, 0),
])
def test_reservation_output_tokens(mode, predicted, expected):
    assert reservation_output_tokens(mode, MAX_TOKENS, predicted) == expected
