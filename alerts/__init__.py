"""Alerts: thresholds per customer on its budget, its prepaid credit and its invoice forecast,
delivered as signed webhooks, each once per (customer, threshold, period). docs/alerts.md.

- `rules`: which thresholds a customer has crossed (pure, exact).
- `signing`: the webhook signature, as Stripe signs (`t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`).
- `tables`, `store`: endpoints and their secrets, per-customer thresholds, alerts (unique per
  customer, kind, threshold and period) and deliveries in PostgreSQL; `store.alerts_for(conn,
  customer_id)` is the dashboards' read.
- `evaluate`: reads budgets (serving, through `prediction_service.budgets`), credit and the invoice
  forecast (`prediction_service.forecast`) and records what crossed.
- `delivery`: signed POSTs, retried with exponential backoff; `schedule`: inside `infermeter up`.
- `cli`: `infermeter alerts list|test|evaluate|endpoint|thresholds`.

Layers (import-linter's `alerts` contract): alerts reads the predictors' forecasts, billing and
serving's budgets, so it sits beside `prediction_service`, above it: it imports anything below but
`app` and `dashboards`, and nothing but `app` imports it (the dashboards get `alerts_for` handed in by
`app`, as billing's views are).
"""
