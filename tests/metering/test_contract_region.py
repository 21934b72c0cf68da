"""`region`, the optional v1 field of request and replica events (data residency): what the builders
write, what `decode_event` reads, and that events without it still decode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from metering.contract import InvalidEvent, decode_event, encode_event, replica_event, request_event

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def request(**extra):
    return request_event(
        source="//gateway/t", request_id="req-1", customer_id="c", model="m", deployment_id="d", status="ok",
        input_tokens=10, cached_input_tokens=0, output_tokens=2, started_at=NOW, finished_at=NOW, **extra,
    )  # fmt: skip


def replica(**extra):
    return replica_event(
        source="//agent/t", replica_id="r-0", deployment_id="d", customer_id=None, gpu_type="cpu", gpu_count=1,
        interval_start=NOW - timedelta(seconds=30), interval_end=NOW, busy_seconds="1.5", prompt_tokens=10,
        generation_tokens=2, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("build", [request, replica])
def test_events_carry_the_region(build):
    built = build(region="eu-west")
    assert built["data"]["region"] == "eu-west"
    assert decode_event(encode_event(built), now=NOW).data.region == "eu-west"


@pytest.mark.parametrize("build", [request, replica])
def test_without_it_the_event_is_as_before_and_decodes_to_none(build):
    built = build()
    assert "region" not in built["data"]
    assert decode_event(encode_event(built), now=NOW).data.region is None


@pytest.mark.parametrize("bad", ["", "EU-West", "eu west", "-eu", 7, "x" * 64])
@pytest.mark.parametrize("build", [request, replica])
def test_bad_regions_are_invalid_data(build, bad):
    raw = msgspec.json.encode(build(region=bad))
    with pytest.raises(InvalidEvent) as caught:
        decode_event(raw, now=NOW)
    assert caught.value.reason == "invalid_data"
    assert "region" in caught.value.detail
