"""The roof: composition only — the `infermeter` CLI, the HTTP API app that mounts each package's
router, the demo and replay orchestration that start the whole local stack, the serving tier of
`up --serving`, and the dashboards' screenshots script.

Tiers: a package imports only from the tiers below it (import-linter's contracts, `[tool.importlinter]`
in pyproject.toml, check each package's rule; README.md, "Layout", lists them):

    app                                   roof: imports anything below, imported by nothing
    dashboards · billing_service          pages; billing's adapters (tables, runs, Stripe);
      · prediction_service                the predictors' adapters (fits in Postgres, forecasts, quotes, CLI)
    serving · pricing_service · billing   the serving tier; pricing's adapters; the pure billing domain
    metering · pricing · prediction       the event contract and ledgers; pure pricing (books, rating, cost);
                                          pure predictors
    infermeter                            ground: settings, database, local stack, time, HTTP auth
"""
