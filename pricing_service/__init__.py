"""Pricing's adapters: usage from the metering tables (`source`, `rate_period`), the price-book
store (`books`, `tables`), experiments and their reports (`compare`, `comparison_report`,
`report_html`), live shadow rating (`shadow`, `api`) and the `infermeter pricing ...` CLI (`cli`)."""
