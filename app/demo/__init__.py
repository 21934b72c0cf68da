"""`infermeter demo`: a month of usage built from the bundled Mooncake trace, through the real stack.

Events -> Kafka -> metering consumer -> Postgres, then a usage summary, the reconcile check
(events emitted == raw events == rollups), the pricing comparison of the example books over the
month, and the month's billing. One module per job:
- `app.demo.run`: `run_demo`, the steps in order on one stack; later steps take the same stack,
  month window and output folder, and each adds its part to summary.json;
- `app.demo.month`: the trace laid out as the month's events (`generate`);
- `app.demo.meter`: publishing the events and waiting until metering has written them (+ ANALYZE);
- `app.demo.usage`: the usage tables and the reconcile check;
- `app.demo.price`: the pricing comparison and the price recommendation;
- `app.demo.bill`: customers, plans, credit, the month's billing run, the invoices and the exports;
- `app.demo.links`: the dashboards' addresses, a demo customer's API key and the admin sign-in.
"""
