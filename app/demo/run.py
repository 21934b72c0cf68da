"""`run_demo`: the demo's steps in order on one stack: generate -> meter (+ ANALYZE) -> usage and
reconcile -> pricing -> billing -> summary.json -> the dashboards' addresses (-> `--serve`)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from app.demo.bill import bill_month, demo_billing_clock
from app.demo.links import dashboard_links
from app.demo.meter import meter, metering_consumer
from app.demo.month import DEFAULT_REQUESTS, generate
from app.demo.price import compare_prices
from app.demo.usage import usage_and_reconcile
from infermeter.settings import Settings
from infermeter.stack.local import open_stack
from infermeter.stack.ports import check_listen_port


def run_demo(settings: Settings, *, full: bool, limit: int | None, seed: int, out_dir: Path,
             console: Console, pricing: bool = True, serve: bool = False, host: str | None = None,
             port: int | None = None) -> dict:
    """The demo's steps, in order, on one stack: build the month's events, meter them, report usage
    and reconcile, compare the price books, bill the month; each step adds its part to `summary`
    (summary.json). Later steps take the same stack, the month [start, end) and out_dir. It ends with
    the dashboards' addresses, a demo customer's API key and the admin sign-in; `serve` keeps the API
    and the pages up on the same stack until Ctrl-C or SIGTERM (the caller handles the signals)."""
    bind = host or settings.api_host
    if serve:  # before the work: no development credentials off loopback, and a port free to serve on
        settings.check_listen_address(bind)
        check_listen_port(bind, port or settings.api_port, "--port" if port else "INFERMETER_API_PORT")
    limit = None if full else (limit or DEFAULT_REQUESTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    with console.status("reading the Mooncake trace and laying out the month…"):
        events, totals, (start, end) = generate(limit, seed)
    events_file = out_dir / "events.jsonl"
    events_file.write_bytes(b"\n".join(events) + b"\n")
    console.print(f"[bold]demo[/]: {start:%B %Y}: {totals.requests:,} requests in {totals.conversations:,} "
                  f"conversations, {totals.tasks:,} tasks, {totals.replica_intervals:,} replica intervals "
                  f"-> {len(events):,} events ({events_file})")

    with open_stack(settings) as stack, metering_consumer(settings, stack) as metering_runs:
        counts = meter(settings, stack, events, console, metering_runs)
        summary = {"window": [start.isoformat(), end.isoformat()], "counts": counts.as_dict()}
        agree = usage_and_reconcile(stack.database_url, totals, start, end, console, summary)
        if pricing:
            summary["pricing"] = compare_prices(stack.database_url, start, end, out_dir, console)
            summary["billing"] = bill_month(stack.database_url, start, out_dir, console)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        console.print(f"reports in {out_dir}")
        if not agree:
            raise RuntimeError("demo: metered usage does not match what was emitted (see above)")
        run_settings = stack.settings_for(settings)
        base = f"http://{bind}:{port or settings.api_port}"
        summary["dashboards"] = dashboard_links(run_settings, stack.database_url, base, start, end, out_dir,
                                                console, serve=serve)
        if serve:
            from app.api import create_app
            from infermeter.stack.signals import serve_http
            from metering.publisher import ack_mode

            run_settings = run_settings.model_copy(update={"ack": ack_mode(settings)})
            # the month was billed as of BILLING_AS_OF: the pages show billing figures as of then
            app = create_app(run_settings, stack.database_url, stack.kafka_bootstrap,
                             billing_clock=demo_billing_clock if pricing else None)
            serve_http(app, host=bind, port=port or settings.api_port, log_level="warning")
        return summary
