"""The experiment on a demo replay (a month built from a sample of the Mooncake trace, through the real
broker, consumer and Postgres): its quantities reconcile with `infermeter usage` for the same window, and its HTML report
renders in headless Chromium without console errors."""

from __future__ import annotations

from decimal import Decimal

import psycopg
from playwright.sync_api import sync_playwright

from app.demo.meter import analyze
from app.demo.month import OCCURRENCES, generate
from infermeter.stack.postgres import to_libpq_url
from metering import queries
from metering.consumer import MeteringConsumer, run_in_thread
from metering.ingest import publish_lines, wait_for_receipt
from metering.kafka import ensure_topics, make_producer
from pricing.cost import attribute
from pricing_service.books import read_cost_model
from pricing_service.compare import default_book_paths, run_comparison
from pricing_service.report_html import write_html
from pricing_service.source import connect, load_dataset
from tests.metering.conftest import retention_clock
from tests.pricing_service.test_html_report import CHROMIUM


def test_demo_replay_pricing_reconciles_and_renders(settings, tmp_path):
    events, totals, (start, end) = generate(800, seed=7)
    ensure_topics(settings.kafka_bootstrap, settings)
    producer = make_producer(settings.kafka_bootstrap, settings.kafka_backend)
    try:
        publication = publish_lines(producer, settings.events_topic, enumerate(events, 1))
    finally:
        producer.close()
    consumer = MeteringConsumer(settings, settings.database_url, settings.kafka_bootstrap, retention_clock=retention_clock)
    thread = run_in_thread(consumer)
    try:
        counts = wait_for_receipt(to_libpq_url(settings.database_url), publication.ingest_id, publication.published,
                                  timeout_s=180, still_running=thread.is_alive)
    finally:
        consumer.stop()
        thread.join(30)
    assert counts.rejected == 0
    analyze(settings.database_url)  # as the demo does after its bulk load

    report = run_comparison(settings.database_url, start, end, default_book_paths())
    data = report.to_json()
    with psycopg.connect(to_libpq_url(settings.database_url)) as conn:
        usage_rows = queries.usage(conn, queries.Window(start, end))
        gpu_ms = conn.execute("SELECT sum(gpu_ms) FROM gpu_ledger_hourly WHERE hour >= %s AND hour < %s",
                              (start, end)).fetchone()[0]
        successes = conn.execute("SELECT count(*) FROM task_outcomes WHERE outcome = 'succeeded' AND finished_at >= %s "
                                 "AND finished_at < %s", (start, end)).fetchone()[0]
    for field in ("requests", "uncached_input_tokens", "cached_input_tokens", "output_tokens"):
        assert Decimal(data["usage"][field]) == sum(r[field] for r in usage_rows), field
    assert sum(r["requests"] for r in usage_rows) == totals.requests == 800 * OCCURRENCES
    assert data["books"][0]["risk"]["bucket"] == "day" and len(data["books"][0]["risk"]["buckets"]) == 30
    # every GPU-second is either billable to a customer or idle time of the shared pool
    with connect(settings.database_url) as conn:
        attribution = attribute(load_dataset(conn, start, end), read_cost_model(None))
    idle_s = sum((s for k, s in attribution.gpu_seconds.items() if not k.customer_id), Decimal(0))
    # each deployment-hour is split by largest remainder on 10^-12 s: the shares add up exactly
    assert Decimal(data["usage"]["gpu_seconds"]) + idle_s == Decimal(gpu_ms) / 1000
    assert Decimal(data["usage"]["successful_tasks"]) == successes
    assert len(data["books"]) == 3 and all(Decimal(b["revenue"]) > 0 for b in data["books"])

    page_path = write_html(report, tmp_path / "pricing.html")
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(page_path.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=20000)
            traces = page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.data.length)")
        finally:
            browser.close()
    assert problems == []
    assert traces == [3, 4, 3, 2, 2]
