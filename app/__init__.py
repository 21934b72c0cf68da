"""The roof: composition only — the `infermeter` CLI, the HTTP API app that mounts each package's
router, and the demo and replay orchestration that start the whole local stack.

Layers (enforced by import-linter, see `[tool.importlinter]` in pyproject.toml):

    app                                   roof: imports anything below, imported by nothing
    dashboards · billing_service          pages; billing's adapters (tables, runs, Stripe);
      · prediction_service                the predictors' adapters (fits in Postgres, forecasts, quotes, CLI)
    serving · pricing_service · billing   the serving tier; pricing's adapters; the pure billing domain
    metering · pricing · prediction       the event contract and ledgers; pure rating; pure predictors
    infermeter                            ground: settings, database, local stack, time, HTTP auth
"""
