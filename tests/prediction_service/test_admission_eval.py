"""`predict eval` reports the predictions made at admission as metering scored them at ingest, beside the
backtest's scores and the online median baseline."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from infermeter.stack.postgres import to_libpq_url
from metering.contract import encode_event, request_event
from prediction_service.evaluate import evaluate
from tests.metering.conftest import meter

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
WINDOW = ("2026-11-02T09:00:00Z", "2026-11-02T13:00:00Z")
RATES = ("requests", "mae_p50", "pinball_p90", "pinball_p99", "coverage_p90", "coverage_p99", "cached_fraction_mae",
         "failure_brier")


def predicted_stream(n: int = 60, seed: int = 3) -> list[bytes]:
    """Requests of two customers on two models over four hours, each with the prediction made at
    admission; some failed, some rejected (not scored), some without a prediction."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        at = START + timedelta(minutes=4 * i, seconds=rng.randrange(60))
        output = rng.randrange(0, 400)
        p50 = rng.randrange(50, 200)
        status = "error" if i % 11 == 5 else "rejected" if i % 13 == 7 else "ok"
        prediction = None if i % 17 == 3 else {
            "model_version": 1, "output_tokens_p50": p50, "output_tokens_p90": p50 + rng.randrange(0, 200),
            "output_tokens_p99": p50 + 200 + rng.randrange(0, 200), "cached_fraction": round(rng.random(), 3),
            "failure_probability": round(rng.random() / 4, 4)}
        input_tokens = rng.randrange(0, 3000)
        lines.append(encode_event(request_event(
            source="//test/gw", request_id=f"q-{i}", customer_id=("cust-a", "cust-b")[i % 2],
            model=("m1", "m2")[(i // 2) % 2], deployment_id="d1", status=status, input_tokens=input_tokens,
            cached_input_tokens=rng.randrange(0, input_tokens + 1), output_tokens=0 if status == "rejected" else output,
            started_at=at - timedelta(seconds=2), finished_at=at, prediction=prediction)))
    return lines


@pytest.fixture
def predicted(settings):
    lines = predicted_stream()
    counts = meter(settings, lines)
    assert counts.accepted == len(lines)
    return settings


def _evaluate(settings, **kwargs) -> dict:
    with psycopg.connect(to_libpq_url(settings.database_url)) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        return evaluate(conn, datetime.fromisoformat(WINDOW[0]), datetime.fromisoformat(WINDOW[1]), spend=False,
                        **kwargs)


def test_the_scores_kept_at_ingest_equal_scoring_the_recorded_predictions_again(predicted):
    """The sums metering kept give the rates prediction.scoring computes from the events' own predictions."""
    kept = _evaluate(predicted)["admission"]
    again = _evaluate(predicted, predictions="admission")
    assert kept["hours"] == {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T13:00:00Z"}
    scored = [p for p in (json.loads(x)["data"] for x in predicted_stream())
              if p.get("prediction") and p["status"] != "rejected"]
    assert kept["all"]["requests"] == len(scored) == again["all"]["requests"]
    assert again["unscored"] == sum(1 for x in predicted_stream() if "prediction" not in json.loads(x)["data"])
    assert [(g["customer_id"], g["model"]) for g in kept["groups"]] == \
        [(g["customer_id"], g["model"]) for g in again["groups"]]
    for mine, theirs in zip([kept["all"], *kept["groups"]], [again["all"], *again["groups"]], strict=True):
        assert {k: mine[k] for k in RATES} == pytest.approx({k: theirs[k] for k in RATES}, abs=2e-6)
    assert [m["model"] for m in kept["models"]] == ["m1", "m2"]
    assert sum(m["requests"] for m in kept["models"]) == kept["all"]["requests"]


def test_eval_json_has_the_admission_scores_next_to_the_backtest_and_its_baseline(predicted, cli):
    run = cli(predicted.database_url, "predict", "eval", "--from", WINDOW[0], "--to", WINDOW[1], "--json", "--no-spend")
    assert run.code == 0, run.err
    result = json.loads(run.out)
    assert result == json.loads(json.dumps(_evaluate(predicted)))
    assert result["admission"]["as"] == "as predicted at admission"
    backtest_models = {m["model"]: m for m in result["models"]}
    assert set(backtest_models) == {"m1", "m2"} and all("baseline_mae_p50" in m for m in backtest_models.values())
    assert sum(m["requests"] for m in result["models"]) == result["all"]["requests"]
    text = cli(predicted.database_url, "predict", "eval", "--from", WINDOW[0], "--to", WINDOW[1], "--no-spend")
    assert text.code == 0 and "as predicted at admission" in text.out and "by customer and model" in text.out


def test_an_event_delivered_twice_is_scored_once(predicted):
    before = _evaluate(predicted)["admission"]
    again = meter(predicted, predicted_stream()[:20] + predicted_stream())  # redelivered, some twice over
    assert again.accepted == 0
    assert _evaluate(predicted)["admission"] == before


def test_a_window_without_predictions_says_so(predicted, cli):
    run = cli(predicted.database_url, "predict", "eval", "--from", "2026-11-02T14:00:00Z",
              "--to", "2026-11-02T16:30:00Z", "--no-spend")
    assert run.code == 0, run.err
    assert "no request in [2026-11-02T14:00:00Z, 2026-11-02T17:00:00Z) carried a prediction made at admission" \
        in run.out
