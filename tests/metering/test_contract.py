"""The v1 contract: committed schemas == structs, every example parses as it says, rules hold."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metering.contract import (
    DATA_TYPES,
    REQUEST_V1,
    InvalidEvent,
    decode_event,
    encode_event,
    make_event,
    rfc3339,
)
from metering.schemas import EXAMPLES_DIR, render, schema_path

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
VALID = sorted((EXAMPLES_DIR / "valid").glob("*.json"))
INVALID = sorted((EXAMPLES_DIR / "invalid").iterdir())


@pytest.mark.parametrize("type_name", list(DATA_TYPES))
def test_committed_schema_matches_the_structs(type_name):
    assert schema_path(type_name).read_text() == render(type_name), (
        "schema file is stale: run `python -m metering.schemas`"
    )


def test_there_are_examples_of_every_type():
    seen = {json.loads(path.read_bytes())["type"] for path in VALID}
    assert seen == set(DATA_TYPES)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_examples_pass_the_schema_and_the_decoder(path):
    raw = path.read_bytes()
    message = json.loads(raw)
    schema = json.loads(schema_path(message["type"]).read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(message)
    event = decode_event(raw, now=NOW)
    assert (event.source, event.id, event.type) == (message["source"], message["id"], message["type"])
    assert event.time.tzinfo is not None and event.time.utcoffset().total_seconds() == 0


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_examples_are_rejected_with_their_reason(path):
    expected_reason = path.name.split(".")[0]
    with pytest.raises(InvalidEvent) as caught:
        decode_event(path.read_bytes(), now=NOW)
    assert caught.value.reason == expected_reason
    assert caught.value.detail  # a human-readable explanation


@pytest.mark.parametrize("path", [p for p in INVALID if p.suffix == ".json"], ids=lambda p: p.name)
def test_schema_rejects_what_the_decoder_rejects_for_shape_errors(path):
    message = json.loads(path.read_bytes())
    reason = path.name.split(".")[0]
    if reason not in ("invalid_data", "invalid_envelope", "unknown_type"):
        return  # semantic rules (cached <= input, subject, future time) live beyond JSON Schema
    type_name = message.get("type")
    schema_type = type_name if type_name in DATA_TYPES else REQUEST_V1
    schema = json.loads(schema_path(schema_type).read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert list(validator.iter_errors(message)), f"{path.name} should fail the schema too"


def test_one_megabyte_payload_is_too_large():
    event = make_event(
        REQUEST_V1, source="//t", subject="c", data={"pad": "x" * 1_000_000}, time=NOW
    )
    with pytest.raises(InvalidEvent) as caught:
        decode_event(encode_event(event), now=NOW, max_bytes=65536)
    assert caught.value.reason == "too_large"


def test_nul_characters_are_rejected_before_they_reach_postgres():
    raw = (EXAMPLES_DIR / "valid" / "request-ok.json").read_bytes().replace(b'"search"', b'"se\\u0000arch"')
    with pytest.raises(InvalidEvent) as caught:
        decode_event(raw, now=NOW)
    assert caught.value.reason == "invalid_json"
    assert caught.value.event_id == "req-0001"


def test_future_tolerance_is_five_minutes():
    def at(seconds_ahead):
        finished = datetime.fromtimestamp(NOW.timestamp() + seconds_ahead, UTC)
        return encode_event(make_event(
            "infermeter.task.v1", source="//t", subject="c",
            data={"task_id": "t", "customer_id": "c", "outcome": "failed", "finished_at": finished},
            time=finished,
        ))
    assert decode_event(at(299), now=NOW).id
    with pytest.raises(InvalidEvent):
        decode_event(at(301), now=NOW)


def test_backfills_of_any_age_are_accepted():
    raw = encode_event(make_event(
        "infermeter.usage.v1", source="//t", subject="c",
        data={"customer_id": "c", "meter": "tool_calls", "quantity": "1"},
        time=datetime(2001, 1, 1, tzinfo=UTC),
    ))
    assert decode_event(raw, now=NOW).time.year == 2001


def test_microseconds_and_zones_are_kept():
    raw = (EXAMPLES_DIR / "valid" / "request-cancelled.json").read_bytes()
    event = decode_event(raw, now=NOW)
    assert event.time == datetime(2026, 11, 2, 0, 0, tzinfo=UTC)  # 01:00+01:00
    made = make_event(REQUEST_V1, source="s", subject="c", data={}, time=datetime(2026, 1, 1, 0, 0, 0, 7, tzinfo=UTC))
    assert made["time"] == "2026-01-01T00:00:00.000007Z"


def _isoformat_z(moment: datetime) -> str:
    """The formatting `rfc3339` replaced (the reference it must equal)."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 3, 22, 5, 7, 0, tzinfo=UTC),  # microsecond 0: still six digits
        datetime(2026, 12, 3, 22, 5, 7, 999999, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # year boundary, both sides
        datetime(2027, 1, 1, 0, 0, 0, 0, tzinfo=UTC),
        datetime(2027, 1, 1, 0, 30, 0, 1, tzinfo=timezone(timedelta(hours=1))),  # 2026-12-31T23:30 UTC
        datetime(2026, 12, 31, 20, 0, 0, 999999, tzinfo=timezone(timedelta(hours=-4, minutes=-30))),  # -> 2027
        datetime(2028, 2, 29, 23, 59, 59, 500000, tzinfo=ZoneInfo("America/New_York")),  # leap day -> March 1
        datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Paris")),  # a DST change
        datetime(2026, 1, 1, tzinfo=timezone.utc),  # noqa: UP017 - the same object as UTC
        datetime(2026, 1, 1, tzinfo=ZoneInfo("UTC")),  # UTC that is not `UTC`
        datetime(1, 1, 1, tzinfo=UTC),  # four-digit years, zero-padded
        datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
    ids=str,
)
def test_rfc3339_is_the_isoformat_it_replaced(moment):
    assert rfc3339(moment) == _isoformat_z(moment)
    assert rfc3339(moment).endswith("Z") and len(rfc3339(moment)) == 27


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones())
    | st.datetimes(timezones=st.just(UTC))
)
def test_rfc3339_equals_the_isoformat_on_any_aware_moment(moment):
    assert rfc3339(moment) == _isoformat_z(moment)


def test_rfc3339_refuses_naive_times():
    with pytest.raises(ValueError, match="timezone-aware"):
        rfc3339(datetime(2026, 1, 1))
