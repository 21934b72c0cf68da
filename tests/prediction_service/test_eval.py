"""`predict eval` and `predict backtest` on the demo month."""

from __future__ import annotations

import json

from prediction_service.evaluate import evaluate
from tests.prediction_service.conftest import MONTH


def test_eval_scores_the_backtest_by_customer_and_model_with_the_spend_interval(demo_conn):
    result = evaluate(demo_conn, *MONTH)
    overall = result["all"]
    assert overall["requests"] == 12_000 - 0 and result["unscored"] == 0
    assert overall["mae_p50"] <= overall["baseline_mae_p50"]
    assert 0.87 <= overall["coverage_p90"] <= 0.93 and overall["coverage_p99"] >= 0.98
    assert len(result["groups"]) == 50 and sum(g["requests"] for g in result["groups"]) == overall["requests"]
    assert result["spend"]["periods"] == 50 and 0.70 <= result["spend"]["coverage"] <= 0.90


def test_eval_of_admission_predictions_counts_events_without_one(demo_conn):
    result = evaluate(demo_conn, *MONTH, predictions="admission", spend=False)
    assert result["unscored"] == 12_000 and result["all"] == {"requests": 0} and "spend" not in result


def test_backtest_and_eval_commands(demo_month, cli):
    window = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-03T00:00:00Z"]
    backtest = cli(demo_month.url, "predict", "backtest", *window, "--json")
    assert backtest.code == 0, backtest.err
    rows = json.loads(backtest.out)["predictions"]
    assert rows and set(rows[0]) == {"source", "id", "output_tokens_p50", "output_tokens_p90", "output_tokens_p99",
                                     "cached_fraction", "failure_probability"}
    assert len({(r["source"], r["id"]) for r in rows}) == len(rows)
    evaluated = cli(demo_month.url, "predict", "eval", *window, "--json", "--no-spend")
    assert evaluated.code == 0, evaluated.err
    assert json.loads(evaluated.out)["all"]["requests"] == len(rows)
    text = cli(demo_month.url, "predict", "eval", *window)
    assert "by customer and model" in text.out
    bad = cli(demo_month.url, "predict", "eval", *window, "--predictions", "oracle")
    assert bad.code == 2 and "--predictions must be one of backtest, admission" in bad.err
