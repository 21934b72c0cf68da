"""Prediction, pure: statistics learned from metered history, and their scoring. No I/O library and
no other project package but `pricing` (money, books, rating) and `infermeter.times` (import-linter's
`prediction-pure` contract); `prediction_service` reads the history, keeps the fitted state in
PostgreSQL and serves the commands. docs/prediction.md says what is predicted, from what, and how
well.

- `prediction.request`: per request, from what is known at admission (`RequestFeatures`): output
  tokens p10/p50/p90/p99 and mean, cached-input fraction, failure probability
  (`RequestPrediction`). `RequestHistory` learns online; `RequestModel` is the fitted lookup table,
  whose `predict_request(features)` is the gateway's hot path (<= 10 us CPU).
- `prediction.tasks`: per customer x model, success probability, attempts until success, a sample of
  tasks (`TaskModel`).
- `prediction.quotes`: a request's and a successful task's cost under a price book, with an 80% interval.
- `prediction.periods`: each customer's spend at its period's end (the invoice forecast) with an 80%
  interval, when credit or a budget runs out, the platform's revenue, cost and margin per book.
- `prediction.backtest`: requests replayed in time order, each predicted from what was metered before it.
- `prediction.scoring`: MAE, pinball loss, coverage, interval calibration, beside an online median.
- `prediction.quantiles`: the exact, growing quantiles every cell keeps.
"""

from prediction.request import RequestFeatures, RequestModel, RequestPrediction

__all__ = ["RequestFeatures", "RequestModel", "RequestPrediction"]
