"""The event contract, v1: a CloudEvents 1.0 JSON envelope and four data types.

Pure: bytes in, typed events or a typed `InvalidEvent` out. The JSON Schema files in
`metering/schemas/` are generated from these structs (`python -m metering.schemas`) and a test
checks that the committed files, the structs and the example messages agree.

Identity for deduplication is (`source`, `id`). An event counts in the period of its `time`
(for a task outcome, when the task finished). Within v1, changes are additive only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, get_args

import msgspec

REQUEST_V1 = "infermeter.request.v1"
TASK_V1 = "infermeter.task.v1"
USAGE_V1 = "infermeter.usage.v1"
REPLICA_V1 = "infermeter.replica.v1"
EVENT_TYPES = (REQUEST_V1, TASK_V1, USAGE_V1, REPLICA_V1)

RequestStatus = Literal["ok", "error", "cancelled", "rejected"]
TaskOutcome = Literal["succeeded", "failed", "abandoned"]
# Why a task failed (or its attempts were retried), when the agent knows (docs/cost-model.md, failures).
FailureCause = Literal["runtime", "capacity", "routing", "client", "model", "verifier"]
REQUEST_STATUSES: tuple[str, ...] = get_args(RequestStatus)
TASK_OUTCOMES: tuple[str, ...] = get_args(TaskOutcome)
FAILURE_CAUSES: tuple[str, ...] = get_args(FailureCause)

# The source of every event a customer's own key reports (POST /v1/events, the gateway's task and
# usage endpoints): the platform sets or checks it, so a price book can tell a customer's word from a
# producer's (docs/metering.md, "Who may report what").
CUSTOMER_SOURCE_PREFIX = "//customer/"


def customer_source(customer_id: str) -> str:
    """The CloudEvents source of the events a customer reports itself: `//customer/<customer_id>`."""
    return CUSTOMER_SOURCE_PREFIX + customer_id


MAX_TOKENS = 10**12  # per event; keeps every sum far inside bigint
QUANTITY_DECIMALS = 12  # the project-wide NUMERIC scale (infermeter.db.QUANTITY_SCALE)

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
When = Annotated[datetime, msgspec.Meta(tz=True)]
MeterName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.:-]{0,63}$")]
DecimalString = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,26}(\.[0-9]{1,12})?$")]
Tags = Annotated[dict[str, str], msgspec.Meta(max_length=64)]
# A data-residency region (e.g. eu-west): lower-case letters, digits and dashes.
Region = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,62}$")]


class Envelope(msgspec.Struct, frozen=True):
    """CloudEvents 1.0 attributes; `data` is decoded per `type` afterwards."""

    specversion: Literal["1.0"]
    id: Id
    source: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    type: str
    subject: Id
    time: When
    data: msgspec.Raw
    datacontenttype: str | None = None
    dataschema: str | None = None


# A probability or fraction, 0..1 (a prediction's, not money).
Probability = Annotated[float, msgspec.Meta(ge=0, le=1)]


class AdmissionPrediction(msgspec.Struct, frozen=True, kw_only=True):
    """What was predicted for a request when the gateway admitted it (docs/prediction.md, "Evaluation"):
    `model_version` is the version of the fit that predicted (`infermeter predict status`). Metering
    scores it against the request's actual outcome at ingest (metering.prediction_scores)."""

    model_version: Annotated[int, msgspec.Meta(ge=1)]
    output_tokens_p50: Tokens
    output_tokens_p90: Tokens
    output_tokens_p99: Tokens
    cached_fraction: Probability
    failure_probability: Probability


class RequestData(msgspec.Struct, frozen=True, kw_only=True):
    request_id: Id
    customer_id: Id
    api_key_id: Id | None = None
    model: Id
    deployment_id: Id
    replica_id: Id | None = None
    status: RequestStatus
    input_tokens: Tokens
    cached_input_tokens: Tokens
    output_tokens: Tokens
    task_id: Id | None = None
    attempt: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1
    # Replicas the gateway tried for this request, the one that served it included (failover);
    # 0: none (rejected before); absent (None) in events of producers that do not record it.
    upstream_attempts: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    started_at: When
    first_token_at: When | None = None
    finished_at: When
    tags: Tags = {}
    # set by the router: whether the prompt's prefix was already served in the window, and on which replica
    prefix_seen: bool | None = None
    prefix_seen_replica: Id | None = None
    # the region of the replica that served (or was tried last); absent when it has none, or when
    # the producer does not record it (data residency, docs/serving.md)
    region: Region | None = None
    # the project of the API key the request was made with (the key's project_id); absent (None) when
    # the key has none: the request then counts under the "no project" bucket, project '' in the rollups
    project: Id | None = None
    # the prediction made at admission; absent from producers that do not predict
    prediction: AdmissionPrediction | None = None


class TaskData(msgspec.Struct, frozen=True, kw_only=True):
    task_id: Id
    customer_id: Id
    outcome: TaskOutcome
    finished_at: When
    failure_cause: FailureCause | None = None


class UsageData(msgspec.Struct, frozen=True, kw_only=True):
    customer_id: Id
    meter: MeterName
    quantity: DecimalString
    task_id: Id | None = None


class ReplicaData(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: Id
    deployment_id: Id
    customer_id: Id | None = None
    gpu_type: Id
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=4096)]
    interval_start: When
    interval_end: When
    busy_seconds: DecimalString
    prompt_tokens: Tokens
    generation_tokens: Tokens
    # the engine's state over the interval, when the agent could read it (vLLM /metrics):
    kv_cache_usage: DecimalString | None = None  # KV-cache usage, a fraction 0..1, mean of the interval's scrapes
    requests_waiting: DecimalString | None = None  # requests in the engine's queue, time-averaged
    requests_running: DecimalString | None = None  # requests running, time-averaged
    region: Region | None = None  # where the replica runs (the replica agent's --region)


DATA_TYPES: dict[str, type[msgspec.Struct]] = {
    REQUEST_V1: RequestData,
    TASK_V1: TaskData,
    USAGE_V1: UsageData,
    REPLICA_V1: ReplicaData,
}

_envelope_decoder = msgspec.json.Decoder(Envelope)
_data_decoders = {name: msgspec.json.Decoder(struct) for name, struct in DATA_TYPES.items()}
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder(decimal_format="string")


@dataclass(frozen=True, slots=True)
class Event:
    """A valid event: its envelope attributes and typed data."""

    source: str
    id: str
    type: str
    subject: str
    time: datetime  # aware UTC; the event time ("occurred_at")
    data: RequestData | TaskData | UsageData | ReplicaData

    @property
    def customer_id(self) -> str:
        return self.subject


class InvalidEvent(Exception):
    """Why an event was rejected: a stable `reason` code and a human `detail`.

    reason codes: too_large, invalid_json, invalid_envelope, unknown_type, invalid_data,
    cached_exceeds_input, subject_mismatch, future_time, bad_interval, bad_quantity; and from
    metering.processor, too_old (older than the retention).
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        source: str | None = None,
        event_id: str | None = None,
        customer_id: str | None = None,
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.source = source
        self.event_id = event_id
        self.customer_id = customer_id


def _identity(raw: bytes) -> dict[str, str | None]:
    """Best-effort source/id/subject of a rejected event, for the dead-letter row."""
    try:
        obj = _any_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {}
    if not isinstance(obj, dict):
        return {}
    pick = lambda key: obj.get(key) if isinstance(obj.get(key), str) else None  # noqa: E731
    return {"source": pick("source"), "event_id": pick("id"), "customer_id": pick("subject")}


def decode_event(
    raw: bytes,
    *,
    now: datetime,
    max_bytes: int = 65536,
    future_tolerance_s: int = 300,
) -> Event:
    """Validate one message. Raises InvalidEvent with a clear reason; never anything else."""
    if len(raw) > max_bytes:
        raise InvalidEvent("too_large", f"event is {len(raw)} bytes; the limit is {max_bytes}", **_identity(raw))
    if b"\\u0000" in raw:
        raise InvalidEvent("invalid_json", "strings may not contain the NUL character (\\u0000)", **_identity(raw))
    try:
        envelope = _envelope_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidEvent("invalid_envelope", str(exc), **_identity(raw)) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidEvent("invalid_json", f"not valid JSON: {exc}") from None
    who = {"source": envelope.source, "event_id": envelope.id, "customer_id": envelope.subject}
    decoder = _data_decoders.get(envelope.type)
    if decoder is None:
        known = ", ".join(EVENT_TYPES)
        raise InvalidEvent("unknown_type", f"type {envelope.type!r} is not one of {known}", **who)
    try:
        data = decoder.decode(envelope.data)
    except msgspec.ValidationError as exc:
        raise InvalidEvent("invalid_data", str(exc).replace("`$", "`$.data", 1), **who) from None
    occurred_at = envelope.time.astimezone(UTC)
    if occurred_at > now + timedelta(seconds=future_tolerance_s):
        raise InvalidEvent(
            "future_time",
            f"time {envelope.time.isoformat()} is more than {future_tolerance_s} s after now ({now.isoformat()})",
            **who,
        )
    _check_rules(envelope, data, who)
    return Event(envelope.source, envelope.id, envelope.type, envelope.subject, occurred_at, data)


def _check_rules(envelope: Envelope, data: Any, who: dict) -> None:
    customer_id = getattr(data, "customer_id", None)
    if customer_id is not None and customer_id != envelope.subject:
        raise InvalidEvent(
            "subject_mismatch", f"subject {envelope.subject!r} != data.customer_id {customer_id!r}", **who
        )
    if isinstance(data, RequestData):
        if data.cached_input_tokens > data.input_tokens:
            raise InvalidEvent(
                "cached_exceeds_input",
                f"cached_input_tokens {data.cached_input_tokens} > input_tokens {data.input_tokens}",
                **who,
            )
        if data.finished_at < data.started_at:
            raise InvalidEvent("bad_interval", "finished_at is before started_at", **who)
    elif isinstance(data, TaskData):
        # a task outcome counts in the period it finished: the envelope time is that instant
        if data.finished_at != envelope.time:
            raise InvalidEvent(
                "time_mismatch",
                f"time {envelope.time.isoformat()} must equal data.finished_at {data.finished_at.isoformat()}: "
                "a task outcome counts in the period the task finished",
                **who,
            )
    elif isinstance(data, ReplicaData):
        if data.interval_end <= data.interval_start:
            raise InvalidEvent("bad_interval", "interval_end must be after interval_start", **who)
        length = (data.interval_end - data.interval_start).total_seconds()
        if Decimal(data.busy_seconds) > Decimal(str(length)):
            raise InvalidEvent(
                "bad_quantity", f"busy_seconds {data.busy_seconds} exceeds the interval length {length}", **who
            )
        if data.kv_cache_usage is not None and Decimal(data.kv_cache_usage) > 1:
            raise InvalidEvent("bad_quantity", f"kv_cache_usage {data.kv_cache_usage} is more than 1 (a fraction)", **who)


# --- producing events --------------------------------------------------------------------------


def rfc3339(moment: datetime) -> str:
    """RFC 3339 with microseconds kept and an explicit UTC offset ('Z'): what
    `moment.astimezone(UTC).isoformat(timespec="microseconds")` says with 'Z' for '+00:00', formatted
    directly (about half the time; four of them an event, tests/metering/test_contract.py)."""
    if moment.tzinfo is not UTC:
        if moment.tzinfo is None:
            raise ValueError("event times must be timezone-aware")
        moment = moment.astimezone(UTC)
    # %-formatting: a third of the time of the same f-string with format specs
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second, moment.microsecond,
    )  # fmt: skip


def make_event(
    type_: str,
    *,
    source: str,
    subject: str,
    data: dict[str, Any],
    event_id: str | None = None,
    time: datetime | None = None,
) -> dict[str, Any]:
    """A CloudEvents dict (datetimes in `data` become RFC 3339 strings on encoding)."""
    if type_ not in DATA_TYPES:
        raise ValueError(f"unknown event type {type_!r}")
    return {
        "specversion": "1.0",
        "id": event_id or str(uuid.uuid4()),
        "source": source,
        "type": type_,
        "subject": subject,
        "time": rfc3339(time or datetime.now(UTC)),
        "datacontenttype": "application/json",
        "data": {k: (rfc3339(v) if isinstance(v, datetime) else v) for k, v in data.items()},
    }


def encode_event(event: dict[str, Any]) -> bytes:
    return _encoder.encode(event)


def partition_key(subject: str | None) -> bytes | None:
    """The Kafka message key of an event: its subject (the customer id), so a customer's events
    stay on one partition, in order. None (no key) for an event without a subject."""
    return subject.encode() if subject else None


def event_partition_key(event: object) -> bytes | None:
    """`partition_key` of a parsed (possibly invalid) event dict."""
    subject = event.get("subject") if isinstance(event, dict) else None
    return partition_key(subject) if isinstance(subject, str) else None


# --- the one builder of each event type (the gateway, the replica agent, the demo, tests) -----------


def request_event(
    *,
    source: str,
    request_id: str,
    customer_id: str,
    model: str,
    deployment_id: str,
    status: str,
    input_tokens: int,
    cached_input_tokens: int,
    output_tokens: int,
    started_at: datetime,
    finished_at: datetime,
    api_key_id: str | None = None,
    replica_id: str | None = None,
    first_token_at: datetime | None = None,
    task_id: str | None = None,
    attempt: int = 1,
    tags: dict[str, str] | None = None,
    upstream_attempts: int | None = None,
    region: str | None = None,
    prefix_seen: bool | None = None,
    prefix_seen_replica: str | None = None,
    prediction: dict[str, Any] | None = None,
    project: str | None = None,
) -> dict[str, Any]:
    """An `infermeter.request.v1` event; its id is the request id and its time `finished_at`
    (usage counts in the period in which the request finished). `upstream_attempts` (how many
    replicas the gateway tried), `region` (the serving replica's), the router's `prefix_seen` /
    `prefix_seen_replica`, the admission-time `prediction` (AdmissionPrediction's fields) and the API
    key's `project` are left out of the data when None."""
    if status not in REQUEST_STATUSES:
        raise ValueError(f"unknown request status {status!r} (one of {', '.join(REQUEST_STATUSES)})")
    data = {
        "request_id": request_id,
        "customer_id": customer_id,
        "api_key_id": api_key_id,
        "model": model,
        "deployment_id": deployment_id,
        "replica_id": replica_id,
        "status": status,
        "input_tokens": input_tokens,
        "cached_input_tokens": cached_input_tokens,
        "output_tokens": output_tokens,
        "task_id": task_id,
        "attempt": attempt,
        "started_at": started_at,
        "first_token_at": first_token_at,
        "finished_at": finished_at,
        "tags": dict(tags or {}),
    }
    if upstream_attempts is not None:
        data["upstream_attempts"] = upstream_attempts
    if region is not None:
        data["region"] = region
    if prefix_seen is not None:
        data["prefix_seen"] = prefix_seen
        if prefix_seen_replica is not None:
            data["prefix_seen_replica"] = prefix_seen_replica
    if prediction is not None:
        data["prediction"] = dict(prediction)
    if project is not None:
        data["project"] = project
    return make_event(REQUEST_V1, source=source, subject=customer_id, data=data, event_id=request_id,
                      time=finished_at)


def task_event(
    *,
    source: str,
    customer_id: str,
    task_id: str,
    outcome: str,
    finished_at: datetime,
    event_id: str | None = None,
    failure_cause: str | None = None,
) -> dict[str, Any]:
    """An `infermeter.task.v1` event: a task's outcome, at the time it finished (and, optionally, why it
    failed or was retried: one of FAILURE_CAUSES)."""
    if outcome not in TASK_OUTCOMES:
        raise ValueError(f"unknown task outcome {outcome!r} (one of {', '.join(TASK_OUTCOMES)})")
    if failure_cause is not None and failure_cause not in FAILURE_CAUSES:
        raise ValueError(f"unknown failure cause {failure_cause!r} (one of {', '.join(FAILURE_CAUSES)})")
    data = {"task_id": task_id, "customer_id": customer_id, "outcome": outcome, "finished_at": finished_at}
    if failure_cause is not None:
        data["failure_cause"] = failure_cause
    return make_event(TASK_V1, source=source, subject=customer_id, data=data, event_id=event_id,
                      time=finished_at)


def usage_event(
    *,
    source: str,
    customer_id: str,
    meter: str,
    quantity: str,
    task_id: str | None,
    occurred_at: datetime,
    event_id: str | None = None,
) -> dict[str, Any]:
    """An `infermeter.usage.v1` event (tool calls, verification runs, ...)."""
    data = {"customer_id": customer_id, "meter": meter, "quantity": quantity, "task_id": task_id}
    return make_event(USAGE_V1, source=source, subject=customer_id, data=data, event_id=event_id,
                      time=occurred_at)


SHARED_POOL_SUBJECT = "shared-pool"  # the subject of a replica interval that serves every customer


def replica_event(
    *,
    source: str,
    replica_id: str,
    deployment_id: str,
    customer_id: str | None,
    gpu_type: str,
    gpu_count: int,
    interval_start: datetime,
    interval_end: datetime,
    busy_seconds: str,
    prompt_tokens: int,
    generation_tokens: int,
    kv_cache_usage: str | None = None,
    requests_waiting: str | None = None,
    requests_running: str | None = None,
    region: str | None = None,
) -> dict[str, Any]:
    """An `infermeter.replica.v1` event: one GPU interval of a replica, at the interval's end; its
    id is `<replica_id>/<interval_start>` so a re-sent interval is a duplicate. The engine state
    (`kv_cache_usage`, `requests_waiting`, `requests_running`) and the `region` are left out when
    not known."""
    data = {
        "replica_id": replica_id,
        "deployment_id": deployment_id,
        "customer_id": customer_id,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "interval_start": interval_start,
        "interval_end": interval_end,
        "busy_seconds": busy_seconds,
        "prompt_tokens": prompt_tokens,
        "generation_tokens": generation_tokens,
    }
    for name, value in (("kv_cache_usage", kv_cache_usage), ("requests_waiting", requests_waiting),
                        ("requests_running", requests_running), ("region", region)):
        if value is not None:
            data[name] = value
    return make_event(REPLICA_V1, source=source, subject=customer_id or SHARED_POOL_SUBJECT, data=data,
                      event_id=f"{replica_id}/{rfc3339(interval_start)}", time=interval_end)
