"""THE one registry of the serving tier's Prometheus metrics (names live here and only here).

Public API:

    from serving import metrics
    metrics.REGISTRY                       # its own CollectorRegistry (not prometheus_client's global)
    metrics.render() -> bytes              # body of GET /metrics
    metrics.CONTENT_TYPE                   # its Content-Type header
    metrics.record_request(model, status, input_tokens=0, cached_input_tokens=0, output_tokens=0, duration_s=None)
    metrics.record_rejection(reason)       # reason: budget_exceeded | rate_limit_requests | rate_limit_tokens | ...
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

import bisect

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_KINDS = ("input", "cached_input", "output")


class _RequestTotals:
    """The three per-request families (requests, tokens, durations), kept as plain numbers per model
    and status and turned into metric families when /metrics is scraped: a request costs a dict
    lookup and a few additions, not five labelled children with a lock each. Recorded on the
    gateway's event-loop thread."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}  # (model, status) -> [requests, *tokens by kind]
        self.durations: dict[str, list] = {}  # model -> [count per bucket..., count over the last, sum of seconds]

    def record(self, model: str, status: str, tokens: tuple[int, int, int], duration_s: float | None) -> None:
        counts = self.counts.get((model, status))
        if counts is None:
            counts = self.counts[(model, status)] = [0, 0, 0, 0]
        counts[0] += 1
        counts[1] += tokens[0]
        counts[2] += tokens[1]
        counts[3] += tokens[2]
        if duration_s is not None:
            durations = self.durations.get(model)
            if durations is None:
                durations = self.durations[model] = [0] * (len(DURATION_BUCKETS) + 1) + [0.0]
            durations[bisect.bisect_left(DURATION_BUCKETS, duration_s)] += 1
            durations[-1] += duration_s

    def describe(self):
        return self._families()

    def collect(self):
        return self._families(list(self.counts.items()), list(self.durations.items()))

    def _families(self, counts: list = (), durations: list = ()) -> list:
        requests = CounterMetricFamily("infermeter_gateway_requests", "Requests by model and outcome.",
                                       labels=["model", "status"])
        tokens = CounterMetricFamily("infermeter_gateway_tokens",
                                     "Tokens by model and kind (input = all prompt tokens, cached_input, output).",
                                     labels=["model", "kind"])
        duration = HistogramMetricFamily("infermeter_gateway_request_duration_seconds",
                                         "Gateway receive to last byte sent, seconds.", labels=["model"])
        by_model: dict[str, list[int]] = {}
        for (model, status), (count, *kinds) in counts:
            requests.add_metric([model, status], count)
            totals = by_model.setdefault(model, [0, 0, 0])
            for n, amount in enumerate(kinds):
                totals[n] += amount
        for model, totals in by_model.items():
            for kind, amount in zip(TOKEN_KINDS, totals, strict=True):
                tokens.add_metric([model, kind], amount)
        for model, (*per_bucket, seconds) in durations:
            cumulative, buckets = 0, []
            for bound, count in zip((*DURATION_BUCKETS, float("inf")), per_bucket, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            duration.add_metric([model], buckets, seconds)
        return [requests, tokens, duration]


_REQUESTS = _RequestTotals()
REGISTRY.register(_REQUESTS)
REJECTIONS = Counter(
    "infermeter_gateway_rejections_total", "Admissions refused, by reason.", ["reason"], registry=REGISTRY
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
    _REQUESTS.record(model, status, (input_tokens, cached_input_tokens, output_tokens), duration_s)


def record_rejection(reason: str) -> None:
    REJECTIONS.labels(reason=reason).inc()


def record_failover(model: str, reason: str) -> None:
    """Count one failed upstream try (serving/proxy.py; the request may still be served elsewhere)."""
    FAILOVERS.labels(model=model, reason=reason).inc()


def render() -> bytes:
    """The Prometheus text exposition of every serving metric of this process."""
    return generate_latest(REGISTRY)
