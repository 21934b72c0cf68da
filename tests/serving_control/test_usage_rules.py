"""The token rules of `serving.usage` (`usage_tokens`, `build_request_event`): pure, table-driven.

What vLLM reported (`usage`, final or from the last chunk of an interrupted stream) and how many
token chunks were streamed decide (input, cached input, output, usage_source):
- `upstream`: the response's final usage, as reported (cached clamped to input);
- `partial`: the usage of the last chunk of an interrupted stream: no `prompt_tokens_details`
  there, so 0 cached, and output = max(completion_tokens, streamed chunks);
- `streamed_count`: no usage at all, output = the streamed chunks;
- `none`: nothing at all.
Values that are not non-negative ints (strings, floats, bools, None, negatives) count as 0.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from metering.contract import REQUEST_STATUSES, REQUEST_V1, decode_event, encode_event
from serving.usage import RequestOutcome, build_request_event, usage_tokens

STARTED = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
FINISHED = STARTED + timedelta(seconds=3)


def outcome(
    usage: dict[str, Any] | None = None,
    *,
    final: bool = True,
    streamed: int = 0,
    status: str = "ok",
    tags: dict[str, str] | None = None,
) -> RequestOutcome:
    return RequestOutcome(
        request_id="req-1",
        customer_id="cust-1",
        api_key_id="key-1",
        model="qwen",
        deployment_id="dep-1",
        replica_id="rep-1",
        status=status,
        started_at=STARTED,
        finished_at=FINISHED,
        first_token_at=STARTED + timedelta(seconds=1),
        usage=usage,
        usage_final=final,
        streamed_tokens=streamed,
        tags=dict(tags or {}),
    )


def usage(prompt: Any = 100, completion: Any = 20, cached: Any = None, *, details: Any = None) -> dict:
    reported: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        reported["prompt_tokens_details"] = {"cached_tokens": cached}
    if details is not None:
        reported["prompt_tokens_details"] = details
    return reported


# (case, outcome, expected (input, cached, output, usage_source))
CASES = [
    # upstream: the final usage, as reported
    ("final usage", outcome(usage(100, 20, 64)), (100, 64, 20, "upstream")),
    ("final usage without details", outcome(usage(100, 20)), (100, 0, 20, "upstream")),
    ("final usage, details null", outcome(usage(100, 20, details={"cached_tokens": None})), (100, 0, 20, "upstream")),
    ("final usage, details not an object", outcome(usage(100, 20, details=[64])), (100, 0, 20, "upstream")),
    ("final usage wins over streamed chunks", outcome(usage(100, 20), streamed=35), (100, 0, 20, "upstream")),
    ("final usage of zero output", outcome(usage(100, 0)), (100, 0, 0, "upstream")),
    ("n > 1: completion summed by vLLM", outcome(usage(10, 3 * 17, 0)), (10, 0, 51, "upstream")),
    # cached clamped to input
    ("cached above input", outcome(usage(100, 20, 150)), (100, 100, 20, "upstream")),
    ("cached equal to input", outcome(usage(100, 20, 100)), (100, 100, 20, "upstream")),
    ("cached with no input", outcome(usage(None, 20, 64)), (0, 0, 20, "upstream")),
    # not non-negative ints: 0
    ("negative prompt", outcome(usage(-5, 20, 3)), (0, 0, 20, "upstream")),
    ("negative completion", outcome(usage(100, -1)), (100, 0, 0, "upstream")),
    ("negative cached", outcome(usage(100, 20, -4)), (100, 0, 20, "upstream")),
    ("string counts", outcome(usage("100", "20", "64")), (0, 0, 0, "upstream")),
    ("float counts", outcome(usage(100.0, 20.0, 64.0)), (0, 0, 0, "upstream")),
    ("bool counts", outcome(usage(True, True, True)), (0, 0, 0, "upstream")),
    ("bool false counts", outcome(usage(False, False, False)), (0, 0, 0, "upstream")),
    ("missing counts", outcome({"total_tokens": 120}), (0, 0, 0, "upstream")),
    # partial: an interrupted stream's last chunk (no details: 0 cached)
    ("interrupted stream", outcome(usage(100, 20), final=False, streamed=12), (100, 0, 20, "partial")),
    ("interrupted stream, more chunks than usage", outcome(usage(100, 20), final=False, streamed=35),
     (100, 0, 35, "partial")),
    ("interrupted stream, no chunks", outcome(usage(100, 0), final=False), (100, 0, 0, "partial")),
    ("interrupted stream, bad completion", outcome(usage(100, "x"), final=False, streamed=7), (100, 0, 7, "partial")),
    ("interrupted stream, bool completion", outcome(usage(100, True), final=False, streamed=0),
     (100, 0, 0, "partial")),
    # no usage at all
    ("no usage, streamed chunks", outcome(None, streamed=9), (0, 0, 9, "streamed_count")),
    ("empty usage, streamed chunks", outcome({}, final=False, streamed=9), (0, 0, 9, "streamed_count")),
    ("no usage, nothing streamed", outcome(None), (0, 0, 0, "none")),
    ("empty usage, nothing streamed", outcome({}), (0, 0, 0, "none")),
]


@pytest.mark.parametrize(("case", "request_outcome", "expected"), CASES, ids=[c[0] for c in CASES])
def test_usage_tokens(case, request_outcome, expected):
    assert usage_tokens(request_outcome) == expected


@pytest.mark.parametrize(("case", "request_outcome", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_event_carries_the_tokens_and_their_source(case, request_outcome, expected):
    input_tokens, cached, output_tokens, source = expected
    event = build_request_event(request_outcome, source="//gateway/test")
    data = event["data"]
    assert (data["input_tokens"], data["cached_input_tokens"], data["output_tokens"]) == (
        input_tokens, cached, output_tokens,
    )
    assert data["tags"] == {"usage_source": source}
    # A valid event by the contract: what the gateway emits, metering accepts.
    decode_event(encode_event(event), now=FINISHED)


@pytest.mark.parametrize("status", [s for s in REQUEST_STATUSES if s != "rejected"])
def test_every_status_but_rejected_is_tagged_with_its_usage_source(status):
    event = build_request_event(outcome(usage(100, 20), final=False, status=status, tags={"route": "chat"}),
                                source="//gateway/test")
    assert event["data"]["status"] == status
    assert event["data"]["tags"] == {"route": "chat", "usage_source": "partial"}


@pytest.mark.parametrize(
    ("request_outcome", "expected_tokens"),
    [
        (outcome(None, status="rejected"), (0, 0, 0)),
        (outcome(usage(100, 20, 8), status="rejected", tags={"reason": "budget"}), (100, 8, 20)),
    ],
)
def test_rejected_requests_carry_no_usage_source(request_outcome, expected_tokens):
    event = build_request_event(request_outcome, source="//gateway/test")
    data = event["data"]
    assert "usage_source" not in data["tags"]
    assert data["tags"] == request_outcome.tags
    assert (data["input_tokens"], data["cached_input_tokens"], data["output_tokens"]) == expected_tokens


def test_the_outcomes_tags_are_not_modified():
    request_outcome = outcome(usage(), tags={"route": "chat"})
    event = build_request_event(request_outcome, source="//gateway/test")
    assert request_outcome.tags == {"route": "chat"}
    assert event["data"]["tags"] == {"route": "chat", "usage_source": "upstream"}


def test_the_event_is_the_requests_and_counts_when_it_finished():
    event = build_request_event(outcome(usage()), source="//gateway/test")
    assert (event["type"], event["id"], event["subject"], event["source"]) == (
        REQUEST_V1, "req-1", "cust-1", "//gateway/test",
    )
    assert event["time"] == "2025-03-01T12:00:03.000000Z" == event["data"]["finished_at"]
    data = event["data"]
    assert (data["api_key_id"], data["model"], data["deployment_id"], data["replica_id"]) == (
        "key-1", "qwen", "dep-1", "rep-1",
    )
    assert data["started_at"] == "2025-03-01T12:00:00.000000Z"
    assert data["first_token_at"] == "2025-03-01T12:00:01.000000Z"


def test_the_keys_project_rides_in_the_event_and_is_left_out_without_one():
    with_project = build_request_event(replace(outcome(usage()), project="search"), source="//gateway/test")
    without = build_request_event(outcome(usage()), source="//gateway/test")
    assert with_project["data"]["project"] == "search"
    assert "project" not in without["data"]
    assert decode_event(encode_event(with_project), now=FINISHED).data.project == "search"
    assert decode_event(encode_event(without), now=FINISHED).data.project is None


@pytest.mark.parametrize("status", ["OK", "timeout", "", "succeeded"])
def test_an_unknown_status_raises(status):
    with pytest.raises(ValueError, match="unknown request status"):
        build_request_event(outcome(usage(), status=status), source="//gateway/test")
