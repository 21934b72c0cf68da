"""Finishing a request: its one usage event, and the SSE relay that meters a stream however it ends.

Every request that passes authentication and body checks ends in exactly one
`infermeter.request.v1` event (ok, error, cancelled or rejected): `finish` builds it
(`serving.usage.build_request_event`), hands it to the sink, counts it and settles the request's
admission reservation; a second call is a no-op. `finish_after_send` defers it until the response
has been handed to the client (`RequestContext.after_send`, run by `GatewayApp`). The event names
the model, deployment and replica of the last try (the one that served, after a failover; tag
`fallback_from` when that is a fallback model), `upstream_attempts`, the replicas tried, and, once a
replica was tried, `prefix_seen` / `prefix_seen_replica` from the gateway's prefix memory
(serving/prefix_memory.py).

`MeteredStream` relays vLLM's SSE stream as it arrives (the chunks of one burst in one write). The
gateway always asks vLLM for `stream_options: {include_usage: true, continuous_usage_stats: true}`, so the tokens generated so
far are known at every chunk, and strips from what the client sees whatever it did not ask for
(the usage-only final chunk, the per-chunk usage). When the client disconnects mid-stream the
upstream connection is closed (vLLM aborts the request) and the event says `cancelled` with the
output tokens generated up to then. A stream reaches `MeteredStream` with its first chunk already
received (serving/proxy.py waits for it, so that a replica failing before it is failed over); once
bytes went to the client there is no retry: an upstream that breaks mid-stream ends the stream with
an SSE error event, and the request's event says `error` with the tokens of the last chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.responses import Response

from serving import metrics
from serving.gateway_context import REQUEST_ID_HEADER, GatewayState, RequestContext
from serving.upstream_http import UpstreamError, UpstreamResponse
from serving.usage import RequestOutcome, build_request_event

log = logging.getLogger("serving.gateway")


# --- the replica a request holds, the headers its response carries ---------------------------


def release(ctx: RequestContext) -> None:
    if ctx.holds_replica:
        ctx.holds_replica = False
        ctx.replica.in_flight -= 1


def with_headers(response: Response, ctx: RequestContext) -> Response:
    response.headers[REQUEST_ID_HEADER] = ctx.request_id
    for name, value in ctx.extra_headers.items():
        response.headers[name] = value
    return response


class JsonAnswer(Response):
    """A 200 JSON answer with the request's headers, sent as two ASGI messages: what `Response` +
    `with_headers` send, without building header objects (the proxy's success path)."""

    def __init__(self, body: bytes, ctx: RequestContext) -> None:
        self.status_code = 200
        self.body = body
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json"),
            (REQUEST_ID_HEADER.encode(), ctx.request_id.encode()),
            *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in ctx.extra_headers.items()),
        ]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


# --- finishing a request: the one event -------------------------------------------------------


def finish_after_send(state: GatewayState, ctx: RequestContext, status: str, **details: Any) -> None:
    ctx.after_send = functools.partial(finish, state, ctx, status, **details)


async def finish(
    state: GatewayState,
    ctx: RequestContext,
    status: str,
    *,
    usage: dict | None = None,
    usage_final: bool = False,
    streamed_tokens: int = 0,
    first_token_at: datetime | None = None,
    finished_at: datetime | None = None,
    tags: dict[str, str] | None = None,
    settle: bool = True,
) -> None:
    """Emit the request's one event (idempotent per request), count it, settle its reservation."""
    if ctx.finished:
        return
    ctx.finished = True
    if ctx.fallback_from is not None:  # served (or last tried) by a fallback model: say which was asked
        tags = {**(tags or {}), "fallback_from": ctx.fallback_from}
    prefix_seen = seen_on = None
    if ctx.replica is not None and state.prefix_memory is not None:  # serving/prefix_memory.py
        served = isinstance(usage, dict) and bool(usage.get("prompt_tokens"))  # the prompt reached the engine
        try:
            seen_on = state.prefix_memory.observe(ctx.route.name, ctx.body, ctx.replica.replica_id, served=served)
            prefix_seen = seen_on is not None
        except Exception:  # the claim is optional; the event (the usage) is not
            log.exception("prefix memory failed for %s", ctx.request_id)
    outcome = RequestOutcome(
        request_id=ctx.request_id,
        customer_id=ctx.customer_id,
        api_key_id=ctx.principal.api_key_id,
        model=ctx.route.name,
        deployment_id=ctx.route.deployment_id,
        replica_id=ctx.replica.replica_id if ctx.replica else None,
        status=status,
        started_at=ctx.started_at,
        finished_at=finished_at or datetime.now(UTC),
        first_token_at=first_token_at,
        usage=usage,
        usage_final=usage_final,
        streamed_tokens=streamed_tokens,
        task_id=ctx.task_id,
        attempt=ctx.attempt,
        tags=tags or {},
        upstream_attempts=ctx.upstream_attempts,
        region=ctx.replica.region if ctx.replica else None,
        prefix_seen=prefix_seen,
        prefix_seen_replica=seen_on,
        prediction=None if ctx.prediction is None else ctx.prediction.to_event(),
        project=ctx.principal.project_id,
    )
    event = build_request_event(outcome, source=state.source)
    data = event["data"]
    try:
        # The client has its answer (or is past needing it): the event joins the rest of this
        # event-loop iteration's in one spool transaction (serving/emitter.py `emit_batched`).
        getattr(state.sink, "emit_batched", state.sink.emit)(event)
        state.emitted += 1
    except Exception:  # the spool itself failed: say so loudly, the response still goes out
        log.exception("could not spool the usage event of %s", ctx.request_id)
    metrics.record_request(
        ctx.route.name, status, data["input_tokens"], data["cached_input_tokens"], data["output_tokens"],
        time.perf_counter() - ctx.started_mono,
    )
    if settle and ctx.admitted and state.admission is not None:
        try:
            await state.admission.settle(
                ctx.request_id,
                input_tokens=data["input_tokens"],
                cached_input_tokens=data["cached_input_tokens"],
                output_tokens=data["output_tokens"],
                event_source=event["source"],
                event_id=event["id"],
            )
        except Exception:
            log.exception("could not settle the reservation of %s", ctx.request_id)


# --- streaming -------------------------------------------------------------------------------


YIELD_EVERY = 16  # relayed chunks between two turns of the event loop (a disconnect is seen within ~3)


class MeteredStream(Response):
    """Relays vLLM's SSE stream chunk by chunk, tracking usage, and meters however it ends."""

    def __init__(self, state: GatewayState, ctx: RequestContext, upstream: UpstreamResponse) -> None:
        self.state = state
        self.ctx = ctx
        self.upstream = upstream
        self.status_code = 200
        options = ctx.body.get("stream_options") or {}
        self.client_usage = bool(options.get("include_usage"))
        self.client_continuous = self.client_usage and bool(options.get("continuous_usage_stats"))
        self.background = None
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            REQUEST_ID_HEADER: ctx.request_id,
            **ctx.extra_headers,
        }
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope, receive, send) -> None:  # noqa: C901 - one loop, every exit metered
        ctx = self.ctx
        task = asyncio.current_task()
        streaming = True
        disconnected = False

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if streaming:
                        disconnected = True
                        task.cancel()
                    return

        watcher = asyncio.create_task(watch_disconnect())
        usage: dict | None = None
        usage_final = False
        streamed = 0
        first_token_at: datetime | None = None
        status = "ok"
        tags: dict[str, str] = {}
        upstream_model = ctx.route.upstream_model.encode()
        rename = ctx.route.upstream_model != ctx.route.name
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            since_yield = 0
            done = False
            # Every line that came in one burst is relayed in one send (one write to the client).
            async for lines in self.upstream.line_batches():
                out: list[bytes] = []
                for line in lines:
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].rstrip(b"\r\n")
                    if payload == b"[DONE]":
                        out.append(b"data: [DONE]\n\n")
                        done = True
                        break
                    try:
                        chunk = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(chunk, dict):
                        continue
                    if "error" in chunk:
                        status = "error"
                        tags["error"] = "upstream_stream_error"
                    choices = chunk.get("choices")
                    chunk_usage = chunk.get("usage")
                    if chunk_usage:
                        usage = chunk_usage
                        if not choices:
                            usage_final = True
                    if choices:
                        for choice in choices:
                            delta = choice.get("delta")
                            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                            if text or (
                                isinstance(delta, dict) and (delta.get("tool_calls") or delta.get("reasoning"))
                            ):
                                streamed += 1
                                if first_token_at is None:
                                    first_token_at = datetime.now(UTC)
                        if chunk_usage is not None and not self.client_continuous:
                            del chunk["usage"]
                            payload = orjson.dumps(chunk)
                    elif chunk_usage is not None and not self.client_usage:
                        continue  # the usage-only final chunk the client did not ask for
                    if rename:
                        payload = payload.replace(
                            b'"model":"' + upstream_model + b'"', b'"model":"' + ctx.route.name.encode() + b'"', 1
                        )
                    out.append(b"data: " + payload + b"\n\n")
                    since_yield += 1
                    if since_yield == YIELD_EVERY:
                        # Lines already buffered (a burst from vLLM, or this process late for the CPU) are
                        # relayed without the event loop running, and after a client has gone the server's
                        # send returns quietly: let the loop see a disconnect (the watcher cancels this
                        # task) now and then.
                        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                        out, since_yield = [], 0
                        await asyncio.sleep(0)
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if done:
                    break
            if not done and status == "ok":  # the upstream closed without [DONE]
                status = "error"
                tags["error"] = "upstream_stream_truncated"
            streaming = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            streaming = False
            if not disconnected:
                status = "cancelled"
                tags["reason"] = "server_shutdown"
                raise
            task.uncancel()
            status = "cancelled"
            tags["reason"] = "client_disconnected"
        except OSError:  # the server could not write to the client: it is gone
            status = "cancelled"
            tags["reason"] = "client_disconnected"
        except (TimeoutError, UpstreamError) as exc:
            status = "error"
            tags["error"] = "upstream_broken"
            with contextlib.suppress(Exception):
                error = {
                    "error": {
                        "message": f"upstream failed mid-stream: {exc}",
                        "type": "api_error",
                        "param": None,
                        "code": "upstream_error",
                    }
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(error) + b"\n\n",
                        "more_body": False,
                    }
                )
        finally:
            streaming = False
            watcher.cancel()
            if status == "ok":
                self.upstream.release()
            else:
                self.upstream.close()  # drops the connection: vLLM aborts the request
            release(ctx)
            await finish(
                self.state,
                ctx,
                status,
                usage=usage,
                usage_final=usage_final,
                streamed_tokens=streamed,
                first_token_at=first_token_at,
                tags=tags,
            )
