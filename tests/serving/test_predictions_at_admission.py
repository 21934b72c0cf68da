"""Predictions at admission (serving/predictions.py): the newest stored fit is held as a lookup table,
reloaded when a new version appears; every request event carries the prediction made at admission;
a predictive budget reserves it. Against the real components: fits written by
prediction_service.store on PostgreSQL, the session's gateway in front of vLLM, events checked where
metering stored them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import msgspec
import openai
import psycopg
import pytest
from sqlalchemy import create_engine

from infermeter.stack.postgres import to_libpq_url
from metering.contract import AdmissionPrediction
from prediction.request import RequestFeatures, RequestModel, RequestPrediction
from prediction_service import store
from serving.budget_prices import list_price
from serving.budgets import AdmissionController, set_budget
from serving.openai_api import prompt_token_bound
from serving.predictions import SHARED_MAX, AdmissionPredictor, Prediction, newest_request_model

MODEL = "tiny-llama"
FIELDS = {"model_version", "output_tokens_p50", "output_tokens_p90", "output_tokens_p99", "cached_fraction",
          "failure_probability"}


MAX_MODEL_LEN = 2048  # the tiny model's context (serving.vllm_server's default --max-model-len)


def _fit(database_url: str) -> store.FitInfo:
    now = datetime.now(UTC)
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        info = store.fit(conn, now - timedelta(hours=1), now + timedelta(minutes=5), now=now, trigger="cli")
        conn.commit()
    return info


def test_the_predictor_takes_each_new_fit_version_and_none_before_the_first(db_url):
    engine = create_engine(db_url)
    predictor = AdmissionPredictor.on_engine(engine, reload_s=0.05)
    try:
        assert predictor.reload() is False and predictor.version == 0
        assert predictor.predict("c1", "m1", 100, 50) is None  # no fit: no prediction
        with engine.connect() as conn:
            assert newest_request_model(conn) is None
        first = _fit(db_url)
        assert predictor.reload() is True and predictor.version == first.version
        assert predictor.reload() is False  # nothing newer: the table held stays, no decoding
        prediction = predictor.predict("c1", "m1", 100, 50)
        assert isinstance(prediction, Prediction) and prediction.model_version == first.version
        assert set(prediction.to_event()) == FIELDS
        predictor.start()  # the thread: a newer fit is picked up without a request waiting for it
        second = _fit(db_url)
        deadline = time.monotonic() + 10
        while predictor.version != second.version and time.monotonic() < deadline:
            time.sleep(0.02)
        assert predictor.version == second.version > first.version
        with engine.connect() as conn:
            assert newest_request_model(conn, second.version) is None
            assert newest_request_model(conn, first.version)[0] == second.version
    finally:
        predictor.stop()
        engine.dispose()


@pytest.fixture
def fitted_gateway(gateway, pipeline):
    """The session gateway, reset to no fit afterwards (other tests expect events without predictions)."""
    predictor = gateway.state.predictor
    predictor.held = None
    yield gateway
    pipeline.rows("DELETE FROM prediction_fits RETURNING version")
    predictor.held = None


def _chat(client, content: str, max_tokens: int, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
                                          **kwargs)


def test_every_request_event_carries_the_prediction_made_at_admission(fitted_gateway, pipeline, client, customer):
    _chat(client, "Name the first lighthouse.", 6)
    [before] = pipeline.request_events(customer.customer_id, 1)
    assert "prediction" not in before["data"]  # no fit yet: the field is absent

    info = _fit(pipeline.database_url)
    assert info.requests >= 1
    assert fitted_gateway.state.predictor.reload() is True
    with psycopg.connect(to_libpq_url(pipeline.database_url)) as conn:
        table = store.latest(conn).requests

    content = "Name the second lighthouse."
    _chat(client, content, 5)
    stream = _chat(client, content, 4, stream=True)
    for _ in stream:
        pass
    tally = fitted_gateway.state.arrivals  # the capacity signal's demand at arrival (serving/capacity_arrivals.py)
    window = (datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(minutes=2))
    arrived_before = sum(m.output_tokens for m in tally.minutes(*window).get("tiny-cpu", []))
    _chat(client, content, 5)
    stream = _chat(client, content, 4, stream=True)
    for _ in stream:
        pass
    events = pipeline.request_events(customer.customer_id, 5)
    arrived = sum(m.output_tokens for m in tally.minutes(*window).get("tiny-cpu", [])) - arrived_before
    assert arrived >= sum(e["data"]["prediction"]["output_tokens_p50"] for e in events[3:])  # their p50s, at arrival
    body = {"messages": [{"role": "user", "content": content}]}
    by_cap = {e["data"]["output_tokens"]: e["data"] for e in events[1:3]}
    for cap in (5, 4):
        data = by_cap[cap]
        expected = table.predict_request(RequestFeatures(customer.customer_id, MODEL, prompt_token_bound(body), cap))
        assert data["prediction"] == Prediction(info.version, expected).to_event()
        assert set(data["prediction"]) == FIELDS
        assert data["prediction"]["output_tokens_p99"] <= cap
        assert 0 <= data["prediction"]["cached_fraction"] <= 1 and 0 <= data["prediction"]["failure_probability"] <= 1


def test_a_predictive_budget_admits_what_the_worst_case_would_refuse(fitted_gateway, pipeline, client, customer):
    """A cap between the request's predicted cost (p99 output) and its worst case (max_tokens): refused
    in hard mode, admitted in predictive mode; the same request, the same fit."""
    engine = create_engine(pipeline.database_url)
    controller = AdmissionController(engine, pipeline.settings)
    try:
        set_budget(engine, customer.customer_id, monthly_cap=Decimal(1000), mode="hard")  # limited from the start
        _chat(client, "Warm the history.", 3)
        pipeline.request_events(customer.customer_id, 1)
        info = _fit(pipeline.database_url)
        fitted_gateway.state.predictor.reload()
        content = "Count the lanterns."
        prompt = prompt_token_bound({"messages": [{"role": "user", "content": content}]})
        with psycopg.connect(to_libpq_url(pipeline.database_url)) as conn:
            p99 = store.latest(conn).requests.predict_request(
                RequestFeatures(customer.customer_id, MODEL, prompt, None)).output_tokens_p99
        # the fit learns from the session's history (other serving tests' requests too, in whatever order
        # the suite ran them), so the request's max_tokens is chosen above the fitted p99, not fixed
        max_tokens = p99 + 50
        assert prompt + max_tokens <= MAX_MODEL_LEN
        assert info.version == fitted_gateway.state.predictor.version
        price = list_price(MODEL, pipeline.settings)
        predicted = price.cost(uncached_input_tokens=prompt, cached_input_tokens=0, output_tokens=p99)
        worst = price.cost(uncached_input_tokens=prompt, cached_input_tokens=0, output_tokens=max_tokens)
        assert worst > predicted > Decimal(0)
        cap = controller.spend(customer.customer_id).total + (predicted + worst) / 2
        set_budget(engine, customer.customer_id, monthly_cap=cap, mode="hard")
        with pytest.raises(openai.APIStatusError) as refused:
            _chat(client, content, max_tokens)
        assert refused.value.status_code == 402
        set_budget(engine, customer.customer_id, monthly_cap=cap, mode="predictive")
        assert _chat(client, content, max_tokens).usage.completion_tokens == max_tokens
    finally:
        set_budget(engine, customer.customer_id, monthly_cap=None, mode="hard")
        controller.close()
        engine.dispose()


def test_the_events_prediction_is_capped_and_its_rates_kept_inside_0_1():
    """metering.contract.AdmissionPrediction refuses rates outside [0, 1] (the whole event would be
    dead-lettered): a fit whose history had cached > input tokens must not cost the request its usage."""
    odd = RequestPrediction(10, 100, 400, 900, 150.0, 1.0000004, -0.0, "global", 40)
    event = Prediction(3, odd, max_tokens=256).to_event()
    assert event == {"model_version": 3, "output_tokens_p50": 100, "output_tokens_p90": 256, "output_tokens_p99": 256,
                     "cached_fraction": 1.0, "failure_probability": 0.0}
    msgspec.convert(event, AdmissionPrediction)  # valid for metering
    assert Prediction(3, odd).to_event()["output_tokens_p99"] == 900  # no max_tokens: uncapped


def test_a_prediction_is_made_once_per_table_row_and_max_tokens_and_shared():
    """The gateway keeps one Prediction (and its event object) per table row and max_tokens
    (AdmissionPredictor): a second request alike gets the same object; another max_tokens its own,
    capped on every figure above it."""
    row = RequestPrediction(10, 100, 400, 900, 150.0, 0.25, 0.01, "global", 40)
    table = RequestModel({}, {}, (row, row, row), 40)
    predictor = AdmissionPredictor(lambda _newer_than: None)
    predictor.held = (7, table)
    assert predictor.held == (7, table) and predictor.version == 7
    uncapped = predictor.predict("c1", "m1", 100, None)
    assert predictor.predict("c2", "m2", 5000, None) is uncapped  # the same row, no max_tokens
    assert uncapped.to_event() == {"model_version": 7, "output_tokens_p50": 100, "output_tokens_p90": 400,
                                   "output_tokens_p99": 900, "cached_fraction": 0.25, "failure_probability": 0.01}
    at_p99 = predictor.predict("c1", "m1", 100, 900)
    assert at_p99 is predictor.predict("c1", "m1", 100, 900) and at_p99.to_event() == uncapped.to_event()
    below = predictor.predict("c1", "m1", 100, 899)  # one below the p99
    assert (below.output_tokens_p50, below.output_tokens_p99) == (100, 899)
    assert below.to_event()["output_tokens_p99"] == 899 and below.to_event()["output_tokens_p90"] == 400
    assert predictor.predict("c1", "m1", 100, 0).to_event()["output_tokens_p50"] == 0
    # a row whose p50 is above its p99 (a stored fit is not checked for it) is capped on every figure
    odd = RequestPrediction(10, 950, 400, 900, 150.0, 0.25, 0.01, "global", 40)
    assert Prediction(7, odd, 900).to_event()["output_tokens_p50"] == 900 == Prediction(7, odd, 900).output_tokens_p50
    assert Prediction(7, odd, 900) == Prediction(7, odd, 900) != Prediction(8, odd, 900)
    predictor.held = None
    assert predictor.predict("c1", "m1", 100, None) is None and predictor.version == 0


def test_the_shared_predictions_start_afresh_past_their_bound():
    row = RequestPrediction(10, 100, 400, 900, 150.0, 0.25, 0.01, "global", 40)
    predictor = AdmissionPredictor(lambda _newer_than: None)
    predictor.held = (7, RequestModel({}, {}, (row, row, row), 40))
    shared = predictor._held[2]
    for cap in range(1, SHARED_MAX + 5):
        assert predictor.predict("c1", "m1", 100, cap).output_tokens_p99 == min(cap, 900)
    assert len(shared) <= SHARED_MAX
