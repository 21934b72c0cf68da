"""The backtest and the evaluation on metered history (`infermeter predict backtest|eval`).

- `backtest_window(conn, start, end)`: the request events of [start, end), each predicted from what was
  metered before it was admitted, the WARMUP_DAYS before `start` included (prediction.backtest).
- `evaluate(conn, start, end, predictions=...)`: the scores of prediction.scoring, overall and by
  customer and model, beside the online median; `predictions="backtest"` scores the backtest's,
  `"admission"` the predictions the gateway recorded in the request events (`data.prediction`, with
  the backtest's fields; events without one are counted as unscored). With `spend=True` also the
  calibration of the 80% spend interval (prediction_service.forecast.spend_calibration).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg

from infermeter.times import Window, utc_text
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
    scores = score(Scored(r.request.customer_id, r.request.model, r.request.status, r.request.output_tokens,
                          r.request.cached_fraction, r.request.failed, r.prediction, r.baseline_p50) for r in rows)
    out = {"window": {"from": utc_text(window.start), "to": utc_text(window.end)}, "predictions": predictions,
           "unscored": unscored, **scores}
    if spend:
        periods = spend_calibration(conn, window.start, window.end, cost_model=cost_model)
        out["spend"] = {**interval_coverage((p.low, p.high, p.actual) for p in periods), "interval": "80%",
                        "as_of": "the middle of each period", "periods_detail": [p.to_json() for p in periods]}
    return out
