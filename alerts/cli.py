"""`infermeter alerts ...`: list what fired, send a test, evaluate on demand, configure endpoints and
thresholds (docs/alerts.md). Errors print one line (`error: ...`) and exit 2; a test or an evaluation
whose delivery failed every attempt exits 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import psycopg
import typer
from rich.console import Console
from rich.table import Table

from infermeter.settings import get_settings
from infermeter.stack import StackError
from infermeter.stack.local import open_stack
from infermeter.stack.postgres import to_libpq_url
from infermeter.times import parse_time, utc_now

app = typer.Typer(help="Alerts on budgets, credit and forecasts, sent as signed webhooks (docs/alerts.md).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
endpoint_app = typer.Typer(help="Webhook endpoints: where alerts are sent, each with its signing secret.",
                           no_args_is_help=True, pretty_exceptions_enable=False)
thresholds_app = typer.Typer(help="A customer's thresholds (the defaults are settings: INFERMETER_ALERT_*).",
                             no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(endpoint_app, name="endpoint")
app.add_typer(thresholds_app, name="thresholds")
console = Console()
err = Console(stderr=True)

AS_JSON = Annotated[bool, typer.Option("--json", help="Print JSON.")]
CUSTOMER = Annotated[str, typer.Option("--customer", help="The customer.")]


@contextmanager
def _clear_errors() -> Iterator[None]:
    try:
        yield
    except (StackError, ValueError, LookupError, OSError, psycopg.Error) as exc:
        message = " ".join((str(exc).strip() or type(exc).__name__).split())
        err.print(f"[red]error:[/red] {message}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@contextmanager
def _connection() -> Iterator[psycopg.Connection]:
    """An autocommit connection to the configured database (each write is its own transaction)."""
    with open_stack(get_settings(), broker=False) as stack, psycopg.connect(
            to_libpq_url(stack.database_url), autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn


def _print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def _send(conn: psycopg.Connection, ids: list[str]) -> list:
    from alerts.delivery import Policy, deliver

    return deliver(conn, Policy.of(get_settings()), ids)


def _attempts_json(attempts) -> list[dict]:
    return [{"delivery_id": a.delivery_id, "attempt": a.attempt, "ok": a.ok, "status": a.status, "error": a.error,
             "outcome": a.outcome} for a in attempts]


def _failed(attempts) -> bool:
    return any(a.outcome == "failed" for a in attempts)


@app.command("list")
def list_cmd(
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer's alerts.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many, newest first.")] = 100,
    as_json: AS_JSON = False,
) -> None:
    """Alerts that fired, newest first, with how each delivery went."""
    from alerts.store import list_alerts

    with _clear_errors(), _connection() as conn:
        rows = list_alerts(conn, customer, limit=limit)
    if as_json:
        _print_json({"alerts": rows})
        return
    table = Table("fired at", "customer", "alert", "period", "deliveries", title="alerts (newest first)")
    for r in rows:
        sent = ", ".join(f"{d['status']} ({d['attempts']})" for d in r["deliveries"]) or "no endpoint"
        table.add_row(r["fired_at"], r["customer_id"], f"{r['kind']} {r['threshold']}", r["period"], sent)
    console.print(table)
    if not rows:
        console.print("No alert has fired" + (f" for {customer}." if customer else "."), highlight=False)


@app.command("test")
def test_cmd(customer: CUSTOMER, as_json: AS_JSON = False) -> None:
    """Send a test alert to every endpoint that takes the customer's alerts, retrying as a real one is."""
    from alerts.evaluate import send_test

    with _clear_errors(), _connection() as conn:
        recorded = send_test(conn, customer, now=utc_now())
        attempts = _send(conn, recorded.deliveries)
    if as_json:
        _print_json({"alert_id": recorded.alert_id, "deliveries": recorded.deliveries,
                     "attempts": _attempts_json(attempts)})
    else:
        for a in attempts:
            console.print(f"{a.delivery_id} attempt {a.attempt}: {'ok' if a.ok else a.error} -> {a.outcome}",
                          highlight=False)
    if _failed(attempts):
        raise typer.Exit(1)


@app.command("evaluate")
def evaluate_cmd(
    customer: Annotated[list[str] | None, typer.Option("--customer", help="Only this customer (repeat).")] = None,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Evaluate as of this instant (default now).")] = None,
    wait: Annotated[bool, typer.Option(help="Send the new alerts now, retrying until each is delivered or failed; "
                                       "--no-wait leaves them to `infermeter up`'s schedule.")] = True,
    as_json: AS_JSON = False,
) -> None:
    """Evaluate the thresholds now (as `infermeter up` does on its schedule) and send what crossed."""
    from alerts.evaluate import default_thresholds, evaluate
    from prediction_service.budgets import ServingBudgets
    from pricing_service.books import read_cost_model

    with _clear_errors():
        settings = get_settings()
        moment = parse_time(as_of, "--as-of") if as_of else utc_now()
        defaults = default_thresholds(settings)
        with open_stack(settings, broker=False) as stack, psycopg.connect(
                to_libpq_url(stack.database_url), autocommit=True) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            with ServingBudgets(stack.database_url, stack.settings_for(settings)) as budgets:
                fired = evaluate(conn, now=moment, defaults=defaults, budgets=budgets, customer_ids=customer or None,
                                 cost_model=read_cost_model(settings.pricing_cost_model))
            ids = [d for f in fired for d in f.deliveries]
            attempts = _send(conn, ids) if wait and ids else []
    if as_json:
        _print_json({"as_of": moment.isoformat(), "alerts": [f.to_json() for f in fired],
                     "attempts": _attempts_json(attempts)})
    else:
        table = Table("customer", "alert", "period", "state", title=f"alerts as of {moment:%Y-%m-%d %H:%M} UTC")
        for f in fired:
            c = f.crossing
            state = (f"new, {len(f.deliveries)} deliveries" if f.deliveries else "new, no endpoint") if f.new \
                else "fired before this period"
            table.add_row(c.customer_id, f"{c.kind} {c.threshold}", c.period, state)
        console.print(table)
        if not fired:
            console.print("No threshold crossed.")
    if _failed(attempts):
        raise typer.Exit(1)


# --- endpoints --------------------------------------------------------------------------------------


@endpoint_app.command("set")
def endpoint_set(
    url: Annotated[str, typer.Option("--url", help="Where to POST alerts (http or https).")],
    secret: Annotated[str | None, typer.Option("--secret", help="The signing secret (default: a new random one, "
                                               "printed once).")] = None,
    customer: Annotated[str | None, typer.Option("--customer", help="Only this customer's alerts (default: "
                                                 "every customer's).")] = None,
    as_json: AS_JSON = False,
) -> None:
    """Add a webhook endpoint, or give an existing one (same url and customer) a new secret."""
    from alerts.store import ANY_CUSTOMER, set_endpoint

    with _clear_errors(), _connection() as conn:
        endpoint, created = set_endpoint(conn, url, secret=secret, customer_id=customer or ANY_CUSTOMER,
                                         now=utc_now())
    shown = created or secret is not None
    if as_json:
        _print_json({**endpoint.to_json(show_secret=shown), "created": created})
        return
    who = f"{customer}'s alerts" if customer else "every customer's alerts"
    console.print(f"{'added' if created else 'updated'} {endpoint.endpoint_id}: {endpoint.url} receives {who}",
                  highlight=False)
    if shown:
        console.print(f"signing secret (keep it; verify with it, docs/alerts.md): {endpoint.secret}",
                      soft_wrap=True, highlight=False)


@endpoint_app.command("list")
def endpoint_list(as_json: AS_JSON = False) -> None:
    """The webhook endpoints (secrets shortened)."""
    from alerts.store import endpoints

    with _clear_errors(), _connection() as conn:
        found = endpoints(conn)
    if as_json:
        _print_json({"endpoints": [e.to_json() for e in found]})
        return
    table = Table("endpoint", "url", "customer", "secret", title="webhook endpoints")
    for e in found:
        table.add_row(e.endpoint_id, e.url, e.customer_id or "(every customer)", e.secret[:10] + "...")
    console.print(table)


@endpoint_app.command("remove")
def endpoint_remove(endpoint: Annotated[str, typer.Argument(help="The endpoint's id or url.")]) -> None:
    """Remove an endpoint; its deliveries not yet made are cancelled."""
    from alerts.store import AlertError, remove_endpoint

    with _clear_errors(), _connection() as conn:
        if not remove_endpoint(conn, endpoint):
            raise AlertError(f"no endpoint {endpoint!r} (see `infermeter alerts endpoint list`)")
    console.print(f"removed {endpoint}", highlight=False)


# --- thresholds -------------------------------------------------------------------------------------


@thresholds_app.command("set")
def thresholds_set(
    customer: CUSTOMER,
    budget: Annotated[str | None, typer.Option(help="Percentages of the monthly budget, e.g. 50,80,100 (none: "
                                               "no budget alerts).")] = None,
    credit: Annotated[str | None, typer.Option(help="Percentages of the prepaid credit balance, e.g. 50,80,100 "
                                               "(none: no credit alerts).")] = None,
    forecast_overspend: Annotated[bool | None, typer.Option(
        "--forecast-overspend/--no-forecast-overspend",
        help="Alert when the invoice forecast's median is above the budget.")] = None,
    credit_runout_days: Annotated[int | None, typer.Option(
        "--credit-runout-days", help="Alert when the credit runs out within this many days (0: never).")] = None,
) -> None:
    """Set a customer's own thresholds; what is not given keeps its value (or the setting's default)."""
    from alerts.store import set_thresholds

    with _clear_errors(), _connection() as conn:
        set_thresholds(conn, customer, budget=budget, credit=credit, forecast_overspend=forecast_overspend,
                       credit_runout_days=credit_runout_days, now=utc_now())
    thresholds_show(customer)


@thresholds_app.command("show")
def thresholds_show(customer: CUSTOMER, as_json: AS_JSON = False) -> None:
    """A customer's thresholds in force, each with where it comes from (the customer's own, or the default)."""
    from alerts.evaluate import default_thresholds
    from alerts.store import thresholds_for

    with _clear_errors(), _connection() as conn:
        thresholds, source = thresholds_for(conn, customer, default_thresholds(get_settings()))
    data = thresholds.to_json()
    if as_json:
        _print_json({"customer_id": customer, **data, "source": source})
        return
    for key, value in data.items():
        shown = ",".join(value) if isinstance(value, list) else str(value).lower()
        console.print(f"{customer} {key.replace('_', ' ')}: {shown or 'none'} ({source[key]})", highlight=False)


@thresholds_app.command("clear")
def thresholds_clear(customer: CUSTOMER) -> None:
    """Drop a customer's own thresholds: the defaults apply again."""
    from alerts.store import clear_thresholds

    with _clear_errors(), _connection() as conn:
        cleared = clear_thresholds(conn, customer)
    console.print(f"{customer}: {'own thresholds removed' if cleared else 'had none'}; the defaults apply",
                  highlight=False)

