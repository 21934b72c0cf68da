"""THE one registry of the serving tier's Prometheus metrics (names live here and only here).

Public API:

    from serving import metrics
    metrics.REGISTRY                       # its own CollectorRegistry (not prometheus_client's global)
    metrics.render() -> bytes              # body of GET /metrics
    metrics.CONTENT_TYPE                   # its Content-Type header
    metrics.record_request(model, status, input_tokens=0, cached_input_tokens=0, output_tokens=0)
    metrics.record_rejection(reason)       # reason: budget_exceeded | rate_limit_requests | rate_limit_tokens | ...
    metrics.REQUEST_DURATION.labels(model=...).observe(seconds)
    metrics.record_failover(model, reason)  # a failed upstream try (reason: connect | reset | timeout | http_5xx | http_429)
    metrics.BREAKER_OPENED.labels(model=..., replica=...).inc()
    metrics.REPLICA_RESTARTS.labels(replica=...).inc()   # `up --serving` restarted a dead vLLM replica

Metric names (each gateway process exposes its own; Prometheus sums across processes):

| name | type | labels | meaning |
| --- | --- | --- | --- |
| infermeter_gateway_requests_total | counter | model, status | requests by outcome (ok, error, cancelled, rejected) |
| infermeter_gateway_tokens_total | counter | model, kind | tokens by kind: input (all prompt tokens), cached_input, output |
| infermeter_gateway_rejections_total | counter | reason | admissions refused, by reason |
| infermeter_gateway_request_duration_seconds | histogram | model | gateway receive -> last byte |
| infermeter_emitter_spool_depth | gauge | spool | events in the spool not yet acknowledged by Kafka |
| infermeter_emitter_publish_lag_seconds | gauge | spool | age of the oldest unacknowledged event (0 when empty) |
| infermeter_emitter_events_emitted_total | counter | spool | events appended to the spool |
| infermeter_emitter_events_published_total | counter | spool | events acknowledged by Kafka |
| infermeter_emitter_publish_failures_total | counter | spool | publish attempts that failed (they are retried) |
| infermeter_replica_agent_scrapes_total | counter | deployment, result | vLLM /metrics scrapes (ok, error) |
| infermeter_replica_agent_intervals_total | counter | deployment | replica intervals emitted |
| infermeter_failover_total | counter | model, reason | upstream tries that failed before the client got a byte (the request went on to another replica or failed): connect, reset, timeout, http_5xx, http_429 |
| infermeter_breaker_opened_total | counter | model, replica | a replica's circuit breaker opened (it was closed and a try on it failed) |
| infermeter_replica_restarts_total | counter | replica | vLLM replicas `infermeter up --serving` restarted after they died (app/serving_stack.py; on up's API at /metrics/serving) |
| infermeter_deployment_demand_tokens_per_second | gauge | deployment | metered prompt + output tokens/s of the last complete minute (serving/capacity.py) |
| infermeter_deployment_demand_forecast_tokens_per_second | gauge | deployment | Holt forecast of that demand at the horizon |
| infermeter_deployment_capacity_tokens_per_second | gauge | deployment | tokens/s one replica sustains while busy (trailing hour) |
| infermeter_deployment_recommended_replicas | gauge | deployment | replicas for the target utilisation, with hysteresis (autoscalers read this) |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

REQUESTS = Counter(
    "infermeter_gateway_requests_total", "Requests by model and outcome.", ["model", "status"], registry=REGISTRY
)
TOKENS = Counter(
    "infermeter_gateway_tokens_total",
    "Tokens by model and kind (input = all prompt tokens, cached_input, output).",
    ["model", "kind"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "infermeter_gateway_rejections_total", "Admissions refused, by reason.", ["reason"], registry=REGISTRY
)
REQUEST_DURATION = Histogram(
    "infermeter_gateway_request_duration_seconds",
    "Gateway receive to last byte sent, seconds.",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
SPOOL_DEPTH = Gauge(
    "infermeter_emitter_spool_depth", "Events spooled and not yet acknowledged by Kafka.", ["spool"], registry=REGISTRY
)
PUBLISH_LAG = Gauge(
    "infermeter_emitter_publish_lag_seconds",
    "Age of the oldest event not yet acknowledged by Kafka (0 when the spool is empty).",
    ["spool"],
    registry=REGISTRY,
)
EVENTS_EMITTED = Counter(
    "infermeter_emitter_events_emitted_total", "Events appended to the spool.", ["spool"], registry=REGISTRY
)
EVENTS_PUBLISHED = Counter(
    "infermeter_emitter_events_published_total", "Events acknowledged by Kafka.", ["spool"], registry=REGISTRY
)
PUBLISH_FAILURES = Counter(
    "infermeter_emitter_publish_failures_total",
    "Event publishes that failed and will be retried.",
    ["spool"],
    registry=REGISTRY,
)
REPLICA_SCRAPES = Counter(
    "infermeter_replica_agent_scrapes_total",
    "Scrapes of vLLM /metrics by the replica agent.",
    ["deployment", "result"],
    registry=REGISTRY,
)
REPLICA_INTERVALS = Counter(
    "infermeter_replica_agent_intervals_total",
    "infermeter.replica.v1 intervals emitted.",
    ["deployment"],
    registry=REGISTRY,
)
# capacity signal (serving/capacity_service.py refreshes them every INFERMETER_CAPACITY_REFRESH_S)
DEMAND_TOKENS = Gauge(
    "infermeter_deployment_demand_tokens_per_second",
    "Metered prompt + output tokens per second of the deployment's last complete minute.",
    ["deployment"],
    registry=REGISTRY,
)
DEMAND_FORECAST_TOKENS = Gauge(
    "infermeter_deployment_demand_forecast_tokens_per_second",
    "Holt's forecast of the deployment's tokens per second at the capacity horizon.",
    ["deployment"],
    registry=REGISTRY,
)
CAPACITY_TOKENS = Gauge(
    "infermeter_deployment_capacity_tokens_per_second",
    "Tokens per second one replica of the deployment sustains while busy (trailing hour of intervals).",
    ["deployment"],
    registry=REGISTRY,
)
RECOMMENDED_REPLICAS = Gauge(
    "infermeter_deployment_recommended_replicas",
    "Replicas the deployment needs for the target utilisation (with scale-down hysteresis).",
    ["deployment"],
    registry=REGISTRY,
)

FAILOVERS = Counter(
    "infermeter_failover_total",
    "Upstream tries that failed before the client got a byte, by model tried and reason.",
    ["model", "reason"],
    registry=REGISTRY,
)
BREAKER_OPENED = Counter(
    "infermeter_breaker_opened_total",
    "Times a replica's circuit breaker opened (closed, then a try on it failed).",
    ["model", "replica"],
    registry=REGISTRY,
)

REPLICA_RESTARTS = Counter(
    "infermeter_replica_restarts_total",
    "vLLM replicas restarted by `infermeter up --serving` after they died.",
    ["replica"],
    registry=REGISTRY,
)

# The children of the per-request metrics, by label values: `labels(...)` takes a lock and
# validates its arguments (~2 us each, five a request); a dict lookup is ~0.1 us. Bounded by the
# models of the upstream file times the statuses.
_REQUEST_CHILDREN: dict[tuple[str, str], tuple] = {}


def _request_children(model: str, status: str) -> tuple:
    children = _REQUEST_CHILDREN.get((model, status))
    if children is None:
        children = _REQUEST_CHILDREN[(model, status)] = (
            REQUESTS.labels(model=model, status=status),
            TOKENS.labels(model=model, kind="input"),
            TOKENS.labels(model=model, kind="cached_input"),
            TOKENS.labels(model=model, kind="output"),
            REQUEST_DURATION.labels(model=model),
        )
    return children


def record_request(
    model: str,
    status: str,
    input_tokens: int = 0,
    cached_input_tokens: int = 0,
    output_tokens: int = 0,
    duration_s: float | None = None,
) -> None:
    """Count one finished request and its tokens (call once per request, next to its event), and
    observe its duration (gateway receive to last byte sent) if given."""
    requests, input_, cached, output, duration = _request_children(model, status)
    requests.inc()
    if input_tokens:
        input_.inc(input_tokens)
    if cached_input_tokens:
        cached.inc(cached_input_tokens)
    if output_tokens:
        output.inc(output_tokens)
    if duration_s is not None:
        duration.observe(duration_s)


def record_rejection(reason: str) -> None:
    REJECTIONS.labels(reason=reason).inc()


def record_failover(model: str, reason: str) -> None:
    """Count one failed upstream try (serving/proxy.py; the request may still be served elsewhere)."""
    FAILOVERS.labels(model=model, reason=reason).inc()


def render() -> bytes:
    """The Prometheus text exposition of every serving metric of this process."""
    return generate_latest(REGISTRY)
