"""The backtest and the evaluation on metered history (`infermeter predict backtest|eval`).

- `backtest_window(conn, start, end)`: the request events of [start, end), each predicted from what was
  metered before it was admitted, the WARMUP_DAYS before `start` included (prediction.backtest).
- `evaluate(conn, start, end, predictions=...)`: the scores of prediction.scoring, overall and by
  customer and model, beside the online median; `predictions="backtest"` scores the backtest's,
  `"admission"` the predictions the gateway recorded in the request events (`data.prediction`, with
  the backtest's fields; events without one are counted as unscored). With `spend=True` also the
  calibration of the 80% spend interval (prediction_service.forecast.spend_calibration). Beside the
  groups by customer and model, `models`: the same scores by model alone.
- Whatever `predictions` says, `admission`: the scores metering kept at ingest of the predictions the
  gateway made at admission (`admission_scores`: metering.prediction_scores, whole hours), "as
  predicted at admission", overall, by customer and model, and by model.
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg

from infermeter.times import Window, ceil_hour, floor_hour, utc_text
from metering.prediction_scores import ScoreSums, scores
from prediction.backtest import BacktestRow, backtest
from prediction.request import RequestPrediction
from prediction.scoring import Scored, interval_coverage, score
from prediction_service import history
from prediction_service.forecast import spend_calibration

WARMUP_DAYS = 28
SOURCES = ("backtest", "admission")


def backtest_window(conn: psycopg.Connection, start: datetime, end: datetime, *, warmup_days: int = WARMUP_DAYS
                    ) -> list[BacktestRow]:
    window = Window(start, end)
    before = history.requests(conn, window.start - timedelta(days=warmup_days), window.start) if warmup_days else []
    return backtest(history.requests(conn, window.start, window.end), before)


def _recorded(prediction: object) -> RequestPrediction | None:
    """A prediction recorded in a request event (the backtest's fields), or None."""
    if not isinstance(prediction, dict):
        return None
    try:
        p50, p90, p99 = (int(prediction[f"output_tokens_p{q}"]) for q in (50, 90, 99))
        return RequestPrediction(int(prediction.get("output_tokens_p10", 0)), p50, p90, p99,
                                 float(prediction.get("output_tokens_mean", p50)),
                                 float(prediction["cached_fraction"]), float(prediction["failure_probability"]),
                                 "admission", 0)
    except (KeyError, TypeError, ValueError):
        return None


def evaluate(conn: psycopg.Connection, start: datetime, end: datetime, *, predictions: str = "backtest",
             spend: bool = True, cost_model=None, warmup_days: int = WARMUP_DAYS) -> dict:
    if predictions not in SOURCES:
        raise ValueError(f"--predictions must be one of {', '.join(SOURCES)}, not {predictions!r}")
    window = Window(start, end)
    rows = backtest_window(conn, window.start, window.end, warmup_days=warmup_days)
    unscored = 0
    if predictions == "admission":
        recorded = {(r.request.source, r.request.event_id): _recorded(r.prediction)
                    for r in history.recorded_requests(conn, window.start, window.end)}
        kept = []
        for row in rows:
            found = recorded.get((row.request.source, row.request.event_id))
            if found is None:
                unscored += 1
            else:
                kept.append(BacktestRow(row.request, found, row.baseline_p50))
        rows = kept
    scored = [Scored(r.request.customer_id, r.request.model, r.request.status, r.request.output_tokens,
                     r.request.cached_fraction, r.request.failed, r.prediction, r.baseline_p50) for r in rows]
    by_model = score(replace(s, customer_id="") for s in scored)["groups"]
    out = {"window": {"from": utc_text(window.start), "to": utc_text(window.end)}, "predictions": predictions,
           "unscored": unscored, **score(scored),
           "models": [{k: v for k, v in g.items() if k != "customer_id"} for g in by_model],
           "admission": admission_scores(conn, window.start, window.end)}
    if spend:
        periods = spend_calibration(conn, window.start, window.end, cost_model=cost_model)
        out["spend"] = {**interval_coverage((p.low, p.high, p.actual) for p in periods), "interval": "80%",
                        "as_of": "the middle of each period", "periods_detail": [p.to_json() for p in periods]}
    return out


# prediction.scoring's names of the rates, from the sums metering keeps (no baseline: that is the backtest's)
_RATES = (("mae_p50", "abs_error_p50"), ("pinball_p90", "pinball_p90"), ("pinball_p99", "pinball_p99"),
          ("coverage_p90", "under_p90"), ("coverage_p99", "under_p99"),
          ("cached_fraction_mae", "abs_error_cached_fraction"), ("failure_brier", "brier_failure"))
_SUMMED = [f.name for f in fields(ScoreSums) if f.name not in ("customer_id", "model")]


def _rates(sums: ScoreSums) -> dict[str, float | int]:
    if not sums.requests:
        return {"requests": 0}
    return {"requests": sums.requests, **{name: round(float(Decimal(getattr(sums, column)) / sums.requests), 6)
                                          for name, column in _RATES}}


def _total(rows: list[ScoreSums]) -> ScoreSums:
    """The sums of several groups' (customer and model left blank)."""
    return ScoreSums("", "", *(sum((getattr(r, name) for r in rows), 0) for name in _SUMMED))


def admission_scores(conn: psycopg.Connection, start: datetime, end: datetime) -> dict:
    """The predictions made at admission, as metering scored them at ingest, over the whole hours that
    meet [start, end) (`hours`): the rates of prediction.scoring (but the baseline), overall (`all`), by
    customer and model (`groups`) and by model (`models`). Requests without a recorded prediction are
    not in it."""
    hours = Window(floor_hour(start), ceil_hour(end))
    rows = scores(conn, hours.start, hours.end)
    models = sorted({r.model for r in rows})
    return {"as": "as predicted at admission", "hours": {"from": utc_text(hours.start), "to": utc_text(hours.end)},
            "all": _rates(_total(rows)),
            "groups": [{"customer_id": r.customer_id, "model": r.model, **_rates(r)} for r in rows],
            "models": [{"model": m, **_rates(_total([r for r in rows if r.model == m]))} for m in models]}
