"""A request's usage record: `build_request_event(outcome)`, the token rules applied to what vLLM said.

The gateway collects what happened to a request in a `RequestOutcome` (who, which model and
replica, the status, the timings, and the usage object vLLM reported) and calls
`build_request_event` exactly once per request, whatever the outcome. The event itself is shaped
by `metering.contract.request_event`, the one builder of `infermeter.request.v1` events.

Token rules:
- `input_tokens` = `usage.prompt_tokens` (all prompt tokens, cached included);
  `cached_input_tokens` = `usage.prompt_tokens_details.cached_tokens` (clamped to input);
  `output_tokens` = `usage.completion_tokens` (summed over choices when n > 1).
- Streams always ask vLLM for continuous usage, so a stream that stops early (client gone,
  upstream broken) still carries the usage of the last chunk received. vLLM sends
  `prompt_tokens_details` only on the final chunk, so an interrupted stream reports 0 cached
  tokens (all input billed as uncached) and the tag `usage_source=partial`.
- No usage at all: output tokens fall back to the number of streamed token chunks
  (`usage_source=streamed_count`), or 0 when nothing was generated (`usage_source=none`).

The event time is `finished_at`: usage counts in the period in which the request finished.
`model`, `deployment_id` and `replica_id` are those of the replica that served the request (after a
failover to a fallback model, that model: the tokens are priced at it), and `upstream_attempts`
says how many replicas were tried; only the serving try's tokens are in the event. `region` is that
replica's region (absent when it has none, or when no replica was tried). `prefix_seen` and
`prefix_seen_replica` are the router's claim that the prompt's prefix was served before, and where
(serving/prefix_memory.py; absent when no replica was tried). `prediction` is what the gateway
predicted at admission from the newest stored fit (serving/predictions.py): `{"model_version",
"output_tokens_p50", "output_tokens_p90", "output_tokens_p99", "cached_fraction",
"failure_probability"}`, an additive optional field of `request.v1`; absent when no fit existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from metering.contract import request_event


@dataclass(slots=True)
class RequestOutcome:
    request_id: str
    customer_id: str
    api_key_id: str | None
    model: str
    deployment_id: str
    replica_id: str | None
    status: str
    started_at: datetime
    finished_at: datetime
    first_token_at: datetime | None = None
    usage: dict[str, Any] | None = None  # vLLM's usage object, as last reported
    usage_final: bool = False  # the usage came from the response's final usage (not a partial chunk)
    streamed_tokens: int = 0  # token chunks seen on a stream (the fallback count)
    task_id: str | None = None
    attempt: int = 1
    tags: dict[str, str] = field(default_factory=dict)
    upstream_attempts: int | None = None  # replicas tried (failover), the serving one included
    region: str | None = None  # the region of that replica (data residency), None when it has none
    # the router's claim (serving/prefix_memory.py): the prompt's prefix was served before, on that replica
    prefix_seen: bool | None = None
    prefix_seen_replica: str | None = None
    # the prediction made at admission (serving/predictions.py `Prediction.to_event()`), None: none made
    prediction: dict[str, Any] | None = None
    project: str | None = None  # the API key's project (None: the key has none)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_tokens(outcome: RequestOutcome) -> tuple[int, int, int, str]:
    """(input, cached input, output, usage_source) for an outcome."""
    usage = outcome.usage
    if usage:
        input_tokens = _int(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details") or {}
        cached = min(_int(details.get("cached_tokens")) if isinstance(details, dict) else 0, input_tokens)
        output_tokens = max(_int(usage.get("completion_tokens")), 0)
        if not outcome.usage_final:
            output_tokens = max(output_tokens, outcome.streamed_tokens)
        return input_tokens, cached, output_tokens, ("upstream" if outcome.usage_final else "partial")
    if outcome.streamed_tokens:
        return 0, 0, outcome.streamed_tokens, "streamed_count"
    return 0, 0, 0, "none"


def build_request_event(outcome: RequestOutcome, *, source: str) -> dict[str, Any]:
    """The `infermeter.request.v1` event of one finished request: its tokens by the rules above,
    shaped by the contract's `request_event` (the gateway calls this once per request)."""
    input_tokens, cached, output_tokens, usage_source = usage_tokens(outcome)
    tags = dict(outcome.tags)
    if outcome.status != "rejected":
        tags["usage_source"] = usage_source
    return request_event(
        source=source,
        request_id=outcome.request_id,
        customer_id=outcome.customer_id,
        api_key_id=outcome.api_key_id,
        model=outcome.model,
        deployment_id=outcome.deployment_id,
        replica_id=outcome.replica_id,
        status=outcome.status,
        input_tokens=input_tokens,
        cached_input_tokens=cached,
        output_tokens=output_tokens,
        task_id=outcome.task_id,
        attempt=outcome.attempt,
        started_at=outcome.started_at,
        first_token_at=outcome.first_token_at,
        finished_at=outcome.finished_at,
        tags=tags,
        upstream_attempts=outcome.upstream_attempts,
        region=outcome.region,
        prefix_seen=outcome.prefix_seen,
        prefix_seen_replica=outcome.prefix_seen_replica,
        prediction=outcome.prediction,
        project=outcome.project,
    )
