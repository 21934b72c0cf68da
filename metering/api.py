"""The metering HTTP API router (FastAPI): event ingestion, usage and task queries, dead letters.

    POST /v1/events          application/cloudevents+json (one) or application/cloudevents-batch+json
    GET  /v1/usage           ?from=&to=&group_by=model,deployment,project,region,day|hour[&customer_id=][&project=]
    GET  /v1/tasks           ?customer_id=   (customers: their own)
    GET  /v1/tasks/{task_id}
    GET  /v1/dead-letters    (admin)

Credentials: `Authorization: Bearer <token>` — the admin token, the producer token, or a
customer API key (`infermeter keys create`). A customer key sends usage and task outcome events for
its own customer only, with source `//customer/<customer_id>` (403 otherwise). A customer asking for another customer's data gets
404 (existence is not disclosed); producer credentials cannot read (403).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from infermeter.auth import Principal
from infermeter.http import DATE_TIME, AdminDep, CredentialsFirst, PrincipalDep, error, error_responses, scope
from infermeter.settings import Settings
from metering import ops_reads, queries, task_reads
from metering.contract import (
    REPLICA_V1,
    REQUEST_V1,
    InvalidEvent,
    customer_source,
    decode_event,
    event_partition_key,
)
from metering.kafka import ensure_topics, make_producer, publish_and_wait
from metering.publisher import ack_mode, outbox_for

CLOUDEVENT = "application/cloudevents+json"
CLOUDEVENT_BATCH = "application/cloudevents-batch+json"
MAX_BATCH = 10_000
_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

router = APIRouter(tags=["metering"], responses=error_responses(400, 401, 403, 404), route_class=CredentialsFirst)


# What the endpoints answer, declared in the OpenAPI document (`responses`, so the answers are not
# re-validated on the way out; tests/test_openapi_fuzz.py checks every answer against them).
class RejectedEvent(BaseModel):
    index: int
    id: str | None
    reason: str
    detail: str


class EventsAccepted(BaseModel):
    published: int
    rejected: list[RejectedEvent]


class UsageRow(BaseModel):
    customer_id: str
    model: str | None = Field(default=None, description="with group_by=model")
    deployment_id: str | None = Field(default=None, description="with group_by=deployment")
    project: str | None = Field(default=None, description="with group_by=project: the API key's project, null for "
                                                          "the requests made without one")
    day: str | None = Field(default=None, description="with group_by=day (RFC 3339, UTC)")
    hour: str | None = Field(default=None, description="with group_by=hour (RFC 3339, UTC)")
    requests: int
    input_tokens: int
    cached_input_tokens: int
    uncached_input_tokens: int
    output_tokens: int


class UsageAnswer(BaseModel):
    from_: str = Field(alias="from")
    to: str
    rows: list[UsageRow]


class Task(BaseModel):
    task_id: str
    customer_id: str
    attempts: int
    requests: int
    input_tokens: int
    cached_input_tokens: int
    uncached_input_tokens: int
    output_tokens: int
    outcome: str = Field(description="succeeded, failed, abandoned, or pending (no outcome reported yet)")
    finished_at: str | None
    first_request_at: str | None
    last_request_at: str | None


class TaskList(BaseModel):
    tasks: list[Task]


def _answers(model: type[BaseModel]) -> dict:
    return {200: {"model": model}}
# What a request cost and what a GPU ran are measured by the platform: only producer credentials (the
# gateway, the replica agent) may report them. A customer key may report its own tool usage and task
# outcomes (docs/metering.md, "Who may report what").
PRODUCER_ONLY_TYPES = frozenset({REQUEST_V1, REPLICA_V1})
# Every event a customer key sends carries the customer's own source, `//customer/<customer_id>`, so no
# customer can report an outcome in the name of a source a price book trusts (a verifier, the gateway).


class Publisher:
    """Takes the events of POST /v1/events before the answer (202).

    Broker ack (INFERMETER_ACK=broker): one shared producer; each request waits for the broker's ack
    of its own events. Metered ack (the default with the embedded, memory-only broker): each request
    appends its events to the durable spool INFERMETER_HOME/spool/api.sqlite3 (one SQLite
    transaction) and is answered; this process's outbox publishes them and forgets them only once
    metering has recorded them (metering/publisher.py), so a crash of the broker or of this process
    loses none: they are published again on the next start."""

    def __init__(self, bootstrap: str, settings: Settings):
        ensure_topics(bootstrap, settings)
        self.topic = settings.events_topic
        self.ack = ack_mode(settings)
        self.outbox = None
        self.producer = None
        if self.ack == "metered":
            self.outbox = outbox_for(settings, "api", bootstrap=bootstrap, database_url=settings.database_url)
            self.outbox.start()
        else:
            self.producer = make_producer(bootstrap, settings.kafka_backend, client_id="infermeter-api")
        self.lock = threading.Lock()

    def publish(self, items: list[tuple], timeout_s: float = 30) -> None:
        """items: (key, value) or (key, value, (source, id))."""
        if self.outbox is not None:
            self.outbox.spool.append_many(items)  # durable when this returns
            self.outbox.wake()
            return
        # The producer is shared by the request threads: each waits with poll under the lock.
        result = publish_and_wait(
            self.producer, self.topic, [(item[0], item[1]) for item in items], timeout_s=timeout_s,
            poll_every_s=0.05, shared_lock=self.lock,
        )
        if result.timed_out:
            raise error(503, "the event bus did not acknowledge the events in time; retry", "bus_timeout")
        if result.failures:
            raise error(503, f"the event bus refused the events: {result.failures[0]}; retry", "bus_error")

    def close(self) -> None:
        if self.outbox is not None:
            self.outbox.close()
            self.outbox.spool.close()
        if self.producer is not None:
            self.producer.flush(10)
            self.producer.close()


_TASK_EXAMPLE = {"specversion": "1.0", "id": "task-7/succeeded", "source": "//agents/runner-1",
                 "type": "infermeter.task.v1", "subject": "cust-a", "time": "2026-11-02T12:00:00Z",
                 "data": {"task_id": "task-7", "customer_id": "cust-a", "outcome": "succeeded",
                          "finished_at": "2026-11-02T12:00:00Z"}}
# The body is read raw (one content type or the other; each event is checked against its type's
# schema, metering/schemas): declared here so the document says what to send.
EVENTS_BODY = {"requestBody": {"required": True, "content": {
    CLOUDEVENT: {"schema": {"type": "object", "description": "one CloudEvent (metering/schemas)"},
                 "example": _TASK_EXAMPLE},
    CLOUDEVENT_BATCH: {"schema": {"type": "array", "items": {"type": "object"}, "maxItems": MAX_BATCH,
                                  "description": "CloudEvents (metering/schemas)"}, "example": [_TASK_EXAMPLE]},
}}}


@router.post("/v1/events", status_code=202, responses={202: {"model": EventsAccepted},
                                                       **error_responses(413, 415, 503)}, openapi_extra=EVENTS_BODY)
async def post_events(request: Request, principal: PrincipalDep) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    try:
        parsed = _json.decode(body)
    except msgspec.DecodeError as exc:
        raise error(400, f"body is not valid JSON: {exc}", "invalid_json") from None
    if content_type == CLOUDEVENT_BATCH or (content_type == "application/json" and isinstance(parsed, list)):
        if not isinstance(parsed, list):
            raise error(400, "a cloudevents batch must be a JSON array", "invalid_batch")
        events = parsed
    elif content_type in (CLOUDEVENT, "application/json"):
        events = [parsed]
    else:
        raise error(415, f"content type must be {CLOUDEVENT} or {CLOUDEVENT_BATCH}", "unsupported_media_type")
    if len(events) > MAX_BATCH:
        raise error(413, f"at most {MAX_BATCH} events per batch", "batch_too_large")
    return await _accept(request.app, principal, events)


async def _accept(app_, principal: Principal, events: list) -> dict[str, Any]:
    if app_.state.publisher is None:
        raise error(503, "no event bus configured", "bus_unavailable")
    now = datetime.now(UTC)
    good: list[tuple] = []
    rejected = []
    for index, item in enumerate(events):
        raw = _encode.encode(item)
        try:
            event = decode_event(raw, now=now, max_bytes=app_.state.settings.max_event_bytes,
                                 future_tolerance_s=app_.state.settings.future_tolerance_s)
        except InvalidEvent as exc:
            rejected.append({"index": index, "id": exc.event_id, "reason": exc.reason, "detail": exc.detail})
            continue
        if not principal.may_act_for(event.subject):
            rejected.append({"index": index, "id": event.id, "reason": "forbidden",
                             "detail": "these credentials may only send events for their own customer"})
            continue
        if event.type in PRODUCER_ONLY_TYPES and principal.kind == "customer":
            rejected.append({"index": index, "id": event.id, "reason": "forbidden",
                             "detail": f"{event.type} events come only from producer credentials (the gateway, "
                                       "the replica agent); a customer key may send infermeter.usage.v1 and "
                                       "infermeter.task.v1"})
            continue
        if principal.kind == "customer" and event.source != customer_source(event.subject):
            rejected.append({"index": index, "id": event.id, "reason": "forbidden_source",
                             "detail": f"an event sent with a customer key must have source "
                                       f"'{customer_source(event.subject)}' (its customer's own), not "
                                       f"'{event.source}': other sources belong to producers"})
            continue
        good.append((event_partition_key(item), raw, (event.source, event.id)))
    if good:
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(app_.state.publisher.publish, good)
    if rejected and not good:
        if all(r["reason"] in ("forbidden", "forbidden_source") for r in rejected):
            raise error(403, f"every event was refused: {rejected[0]['detail']}", "forbidden")
        raise error(400, f"every event was rejected: {rejected[0]['reason']}: {rejected[0]['detail']}",
                    "invalid_events")
    return {"published": len(good), "rejected": rejected}


@router.get("/v1/usage", responses=_answers(UsageAnswer))
def get_usage(
    request: Request,
    principal: PrincipalDep,
    from_: Annotated[str, Query(alias="from", description="RFC 3339", examples=["2026-11-02T00:00:00Z"],
                                json_schema_extra=DATE_TIME)],
    to: Annotated[str, Query(description="RFC 3339 (half-open window)", examples=["2026-11-03T00:00:00Z"],
                             json_schema_extra=DATE_TIME)],
    group_by: Annotated[str | None, Query(description="comma-separated: model, deployment, project, day or hour",
                                          examples=["model,day"])] = None,
    customer_id: str | None = None,
    project: Annotated[str | None, Query(description="only the requests of this project (empty: those without one)")
                       ] = None,
) -> dict[str, Any]:
    customer = scope(principal, customer_id)
    try:
        window = queries.Window(queries.parse_time(from_, "from"), queries.parse_time(to, "to"))
        dims = queries.parse_group_by(group_by)
        if project is not None and "region" in dims:
            raise queries.QueryError("project: not with group_by region (the region rollup is not kept per project)")
    except queries.QueryError as exc:
        raise error(400, str(exc), "invalid_query") from None
    with request.app.state.pool.connection() as conn:
        rows = queries.usage(conn, window, customer_id=customer, group_by=dims, project=project)
    return {"from": window.start.isoformat(), "to": window.end.isoformat(), "rows": rows}


# a customer key reads its own customer; the admin token must name one (400 without)
CustomerParam = Annotated[str | None, Query(description="required with the admin token; a customer key reads "
                                                        "its own customer (another's answers 404)")]


@router.get("/v1/tasks", responses=_answers(TaskList))
def list_tasks(request: Request, principal: PrincipalDep, customer_id: CustomerParam = None, limit: int = 1000) -> dict[str, Any]:
    customer = scope(principal, customer_id)
    if customer is None:
        raise error(400, "customer_id is required for admin credentials", "invalid_query")
    with request.app.state.pool.connection() as conn:
        return {"tasks": task_reads.tasks(conn, customer, limit=min(max(limit, 1), 10_000))}


@router.get("/v1/tasks/{task_id}", responses=_answers(Task))
def get_task(request: Request, principal: PrincipalDep, task_id: str, customer_id: CustomerParam = None) -> dict[str, Any]:
    customer = scope(principal, customer_id)
    if customer is None:
        raise error(400, "customer_id is required for admin credentials", "invalid_query")
    with request.app.state.pool.connection() as conn:
        found = task_reads.tasks(conn, customer, task_id=task_id)
    if not found:
        raise error(404, "not found", "not_found")
    return found[0]


@router.get("/v1/dead-letters")
def get_dead_letters(request: Request, _admin: AdminDep, limit: int = 100, reason: str | None = None) -> dict[str, Any]:
    with request.app.state.pool.connection() as conn:
        return {"dead_letters": ops_reads.dead_letters(conn, limit=min(max(limit, 1), 1000), reason=reason)}

