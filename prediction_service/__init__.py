"""The predictors' adapters: metered history in, fitted state in PostgreSQL, commands and routes out
(`prediction` holds the statistics, pure). See docs/prediction.md.

- `tables`: `prediction_fits`, one row per fit (version, window, when, rows, state).
- `history`: metering's history reads (`metering.history_reads`) as the predictors' observations.
- `store`: fit and save a version, read the one in force (`latest(conn).requests` is the
  `prediction.RequestModel` the gateway will call), status.
- `evaluate`: the backtest and the evaluation (`infermeter predict backtest|eval`).
- `forecast`: per-period forecasts from billing's customers, plans and credits (billing_service) and
  budgets (serving.budgets): spend at period end, credit and budget run-out, the platform's margin.
- `quotes`: a customer's quote under its plan's book.
- `schedule`: the refit inside `infermeter up` (INFERMETER_PREDICT_REFIT_INTERVAL_S).
- `cli`: `infermeter predict ...`, `infermeter quote`; `api`: POST /v1/quotes, GET /v1/predictions/status.

Layers: it reads billing_service and serving, so it sits beside dashboards under the roof; nothing
below imports it (serving gets a `prediction.RequestModel` handed in, never this package).
"""
