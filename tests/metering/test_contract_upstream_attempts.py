"""`upstream_attempts`, the v1 request event's optional field (gateway failover): what
`request_event` writes, what `decode_event` reads, and that events without it still decode."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from metering.contract import InvalidEvent, decode_event, encode_event, request_event

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def event(**extra):
    return request_event(
        source="//gateway/t", request_id="req-1", customer_id="c", model="m", deployment_id="d", status="ok",
        input_tokens=10, cached_input_tokens=0, output_tokens=2, started_at=NOW, finished_at=NOW, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("attempts", [0, 1, 2, 1000])
def test_request_event_carries_upstream_attempts(attempts):
    built = event(upstream_attempts=attempts)
    assert built["data"]["upstream_attempts"] == attempts
    assert decode_event(encode_event(built), now=NOW).data.upstream_attempts == attempts


def test_without_it_the_event_is_as_before_and_decodes_to_none():
    built = event()
    assert "upstream_attempts" not in built["data"]
    assert decode_event(encode_event(built), now=NOW).data.upstream_attempts is None


@pytest.mark.parametrize("bad", [-1, 1001, "2", 1.5, True])
def test_bad_values_are_invalid_data(bad):
    raw = msgspec.json.encode(event(upstream_attempts=bad))
    with pytest.raises(InvalidEvent) as caught:
        decode_event(raw, now=NOW)
    assert caught.value.reason == "invalid_data"
    assert "upstream_attempts" in caught.value.detail
