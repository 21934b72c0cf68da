"""The dashboards' web pages, their JSON and CSV endpoints, sign-in and the static assets, one module
per page or job (`app.router` assembles them; `app.create_dashboard_app` serves them alone):

    auth       GET /signin, POST /signin                customer sign-in with an API key
               GET /admin/signin, POST /admin/signin    admin sign-in with INFERMETER_ADMIN_TOKEN
               POST /signout
    customer   GET /dashboard                           the customer dashboard (?from=&to=&model=; admins add &customer_id=)
               GET /dashboard/data/{chart}.{json|csv}   tokens, requests, cache_hit, gpu, tasks, summary
    invoices   GET /dashboard/invoices.{json|csv}, /dashboard/invoice-lines.csv   the customer's invoices (billing wired)
               GET /dashboard/invoices/{id}[.json|.csv] one of the customer's invoices (another's: 404)
               GET /dashboard/current-period.{json|csv} current-period spend: the billing preview (?period=YYYY-MM)
    pricing    GET /admin/pricing                       pricing experiments (?from=&to=&book=...), live shadow rating
               GET /admin/pricing/data/{chart}.{json|csv}  overview, customers, caching, retries, shadow, comparison (json)
               POST /admin/pricing/books                store an uploaded price book version (YAML)
    ops        GET /admin/ops                           operations (?from=&to= for deployments; ?reconcile_from=&reconcile_to=)
               GET /admin/ops/data/{chart}.{json|csv}   ingest, deployments, dead_letters, consumers, gateways, reconcile
               GET /metrics/metering                    metering's Prometheus metrics (dashboards.metering_metrics)
    finance    GET /admin/finance                       finance (?period=YYYY-MM; a placeholder until billing is wired)
               GET /admin/finance/data/{table}.{json|csv}  revenue_month, revenue_customer, revenue_model, revenue_meter,
                                                        invoice_status, credits
               GET /admin/finance/exports/{kind}.{csv|parquet}?period=   the finance exports, for the signed-in admin
    static     GET /static/plotly.min.js, /static/dashboards.js, /static/dashboards.css

Beside them: `customer_data` (what the customer dashboard and its chart endpoints read), `fast_path`
(the chart endpoints' JSON for a bearer API key, answered before routing), `read_pool` (the chart
endpoints' async read pool), `responses` (pages, JSON, CSV, refusals), `cookies` (the session signer,
CSRF nonce), `openapi` (how the data endpoints are declared), `state` (what the pages read from
app.state).

Pages sign in with a session cookie (dashboards.sessions); the data endpoints also take
`Authorization: Bearer <API key or admin token>`. A customer sees only itself everywhere: asking
for another customer id answers 404, and admin pages answer 403.
"""
