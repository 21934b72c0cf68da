"""`infermeter up` (the whole local stack in the foreground until a signal) and `infermeter api`
(the HTTP API alone)."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from rich.table import Table

from app.cli.common import CliError, console, err_console
from infermeter.settings import get_settings
from infermeter.stack.local import open_stack, write_stack_file
from infermeter.stack.pids import pid_file_for
from infermeter.stack.ports import check_listen_port
from infermeter.stack.postgres import embedded_pgdata, release_embedded_postgres, to_libpq_url
from infermeter.stack.signals import Stopped, serve_http, stop_on_signals, wait_for_signal
from infermeter.stack.stale import clean_stale


def up(
    api: Annotated[bool, typer.Option(help="Serve the HTTP API too.")] = True,
    consumers: Annotated[int, typer.Option(min=0, help="Metering consumer threads to run.")] = 1,
    serving: Annotated[bool, typer.Option(
        "--serving", help="Also run the serving tier: vLLM CPU replicas of the tiny model, a replica agent "
        "each, the gateway; prints its base URL and a new customer key.")] = False,
    replicas: Annotated[int, typer.Option(min=1, max=16, help="With --serving: vLLM replicas to start.")] = 1,
    model: Annotated[str | None, typer.Option(
        help="With --serving: the model directory (default: the tiny Llama, built on first use).")] = None,
    customer: Annotated[str, typer.Option(help="With --serving: the customer the printed key acts for.")] = "local",
) -> None:
    """Run the whole local stack in the foreground until Ctrl-C, SIGTERM or SIGHUP: PostgreSQL, broker, metering, API.

    Stopping (any of those signals) stops the API, the consumers, the broker and the embedded
    PostgreSQL it started, then removes the stack file. The broker dies with this process even on
    `kill -9`; what such a kill leaves behind (PostgreSQL) is found and reused by the next `up`.

    With --serving it also starts N vLLM CPU replicas (--replicas), a replica agent for each and
    the gateway on INFERMETER_GATEWAY_PORT, and prints OPENAI_BASE_URL and OPENAI_API_KEY; a replica
    that dies is restarted (with backoff); they stop first, before the broker (docs/serving.md,
    "One command").
    """
    settings = get_settings()
    if not serving and (replicas != 1 or model is not None or customer != "local"):
        raise CliError("--replicas, --model and --customer go with --serving")
    with stop_on_signals() as guard:
        try:
            _run_up(settings, guard, api=api, consumers=consumers,
                    serving=dict(replicas=replicas, model=model, customer=customer) if serving else None)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the clean-up already ran
            console.print(f"stopped ({exc})" if isinstance(exc, Stopped) else "stopped")
            return
    console.print("stopped")


def _run_up(settings, guard, *, api: bool, consumers: int, serving: dict | None = None) -> None:
    settings.home.mkdir(parents=True, exist_ok=True)
    if api:
        settings.check_listen_address(settings.api_host)  # no development credentials off loopback
    if serving is not None:
        settings.check_listen_address(settings.gateway_host)
    pid_file = pid_file_for(settings)
    for line in clean_stale(settings, pid_file):
        console.print(line, soft_wrap=True, highlight=False)
    _check_ports(settings, api=api, serving=serving is not None)  # before anything starts
    pid_file.start_run()
    try:
        with open_stack(settings, pid_file=pid_file) as stack:
            from metering.publisher import ack_mode, outbox_for

            # The acknowledgement mode follows what was configured, not the broker this stack filled in.
            ack = ack_mode(settings)
            run_settings = stack.settings_for(settings).model_copy(update={"ack": ack})
            from metering.consumer import MeteringConsumer, run_in_thread

            workers = [MeteringConsumer(run_settings, stack.database_url, stack.kafka_bootstrap)
                       for _ in range(consumers)]
            threads = [run_in_thread(w) for w in workers]
            retention = None
            if settings.archive_interval_h > 0:  # months that left the retention: archived, then dropped
                from metering.archive import RetentionJob, archive_dir

                retention = RetentionJob(
                    to_libpq_url(stack.database_url), retention_months=settings.retention_months,
                    directory=archive_dir(settings), interval_s=settings.archive_interval_h * 3600,
                    report=lambda line: console.print(line, soft_wrap=True, highlight=False)).start()
            # Metered ack: events that `events ingest` (and the API) spooled in this home and metering
            # has not confirmed are published (again) to this broker: what a killed stack had
            # acknowledged is metered after all. Fresh rows are left to the process publishing them.
            replayers = []
            if ack == "metered":
                for name in ("ingest", "api") if not api else ("ingest",):
                    replayers.append(outbox_for(run_settings, name, bootstrap=stack.kafka_bootstrap,
                                                database_url=stack.database_url, min_age_s=5.0).start())
            path = write_stack_file(
                settings, stack, api=f"http://{settings.api_host}:{settings.api_port}" if api else None
            )
            from prediction_service.schedule import RefitSchedule

            refits = RefitSchedule(run_settings, stack.database_url).start()  # INFERMETER_PREDICT_REFIT_INTERVAL_S
            from alerts.schedule import AlertSchedule

            alerting = AlertSchedule(run_settings, stack.database_url).start()  # INFERMETER_ALERT_INTERVAL_S
            serving_stack = None
            if serving is not None:  # after the stack file: the agents and the gateway find the stack by it
                from app.serving_stack import ServingStack

                serving_stack = ServingStack(settings, pid_file, console=err_console)
            try:
                if serving_stack is not None:
                    serving_stack.start(replicas=serving["replicas"], model=serving["model"],
                                        customer=serving["customer"])
                _serve_up(settings, stack, ack, path, api, run_settings, serving_stack, serving)
            finally:
                guard.stopping = True  # no signal may cut the clean-up short
                refits.stop()
                alerting.stop()
                if serving_stack is not None:  # before the broker stops: the gateway's last events go out
                    serving_stack.stop()
                if retention is not None:  # stops between two batches of a file: the month stays whole
                    retention.stop()
                for replayer in replayers:  # unconfirmed events stay spooled for the next up
                    replayer.close(2.0)
                    replayer.spool.close()
                for w in workers:
                    w.stop()
                for t in threads:
                    t.join(15)
                path.unlink(missing_ok=True)
        # leaving open_stack stopped the broker
    finally:
        guard.stopping = True
        if not settings.database_url:
            release_embedded_postgres(embedded_pgdata(settings))
        pid_file.remove()


def _check_ports(settings, *, api: bool, serving: bool) -> None:
    """The ports `up` will listen on are free (after `clean_stale`: a killed run's gateway may have held
    one), else one line naming the port and its setting."""
    ports = []
    if api:
        ports.append((settings.api_host, settings.api_port, "INFERMETER_API_PORT"))
    if serving:
        ports.append((settings.gateway_host, settings.gateway_port, "INFERMETER_GATEWAY_PORT"))
    if len(ports) == 2 and ports[0][1] == ports[1][1]:
        raise CliError(f"INFERMETER_API_PORT and INFERMETER_GATEWAY_PORT are both {settings.api_port}: "
                       "the API and the gateway need a port each")
    for host, port, setting in ports:
        check_listen_port(host, port, setting)


def _serve_up(settings, stack, ack, path, api, run_settings, serving_stack, serving) -> None:
    """Print what runs, then serve the API (or wait) until a signal."""
    table = Table(title="infermeter stack", show_header=False)
    table.add_row("PostgreSQL", stack.database_url)
    table.add_row("Kafka bootstrap", stack.kafka_bootstrap)
    table.add_row("events topic", settings.events_topic)
    table.add_row("consumer group", stack.consumer_group)
    table.add_row("acknowledgement", f"{ack} (INFERMETER_ACK)")
    table.add_row("stack file", str(path))
    if api:
        table.add_row("API", f"http://{settings.api_host}:{settings.api_port}")
        table.add_row("dashboards", f"http://{settings.api_host}:{settings.api_port}/dashboard")
        table.add_row("admin token", settings.credentials_note())
    if serving_stack is not None:
        table.add_row("gateway", serving_stack.base_url)
    console.print(table)
    if serving_stack is not None:  # plain lines, never wrapped: the key must be copyable (and parsable)
        for line in serving_stack.status_lines(serving["customer"]):
            console.print(line, soft_wrap=True, highlight=False)
    if api:
        from app.api import create_app

        api_app = create_app(run_settings, stack.database_url, stack.kafka_bootstrap)
        if serving_stack is not None:
            serving_stack.add_metrics_route(api_app)  # GET /metrics/serving: the replica restarts
        serve_http(api_app, host=settings.api_host, port=settings.api_port, log_level="warning")
    else:
        console.print("running; Ctrl-C stops")
        wait_for_signal()


def serve_api(
    host: Annotated[str | None, typer.Option(help="Bind address (INFERMETER_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (INFERMETER_API_PORT).")] = None,
) -> None:
    """Serve the HTTP API alone (events, usage, tasks, dead letters, pricing shadow)."""
    from app.api import create_app
    from metering.publisher import ack_mode

    settings = get_settings()
    settings.check_listen_address(host or settings.api_host)  # no development credentials off loopback
    err_console.print(f"admin token: {settings.credentials_note()}", highlight=False, soft_wrap=True)
    with stop_on_signals(), contextlib.suppress(KeyboardInterrupt), open_stack(settings) as stack:
        # SIGINT, SIGTERM, SIGHUP: uvicorn shuts down, then the broker this command started stops
        run_settings = stack.settings_for(settings).model_copy(update={"ack": ack_mode(settings)})
        serve_http(create_app(run_settings, stack.database_url, stack.kafka_bootstrap),
                   host=host or settings.api_host, port=port or settings.api_port, log_level="info")
