"""An event's identity: its (source, id), what metering deduplicates by and a confirmation names.

- `event_identity(encoded)`: the (source, id) of an encoded event, None if it has none (read without
  decoding the rest of the event).
- `identity_of(event_dict)`: the (source, id) of a decoded event, NO_IDENTITY if it has none.

The spool keeps it with each row (metering/spool.py), so the confirmer (metering/confirmer.py) never
reads or decodes a value to ask metering whether the event is recorded.
"""

from __future__ import annotations

from typing import Any

import msgspec

Key = tuple[str, str]  # an event's (source, id): what metering deduplicates by
# The event's (source, id), kept with the row so the confirmer never reads or decodes the value:
# NULL = not given (decoded from the value when needed); '' = the event has none (metering
# dead-letters it without a key: the broker's ack is all there is to wait for).
NO_IDENTITY = ("", "")


class _Identity(msgspec.Struct):
    source: Any = None
    id: Any = None


_identity = msgspec.json.Decoder(_Identity)


def event_identity(value: bytes) -> Key | None:
    """(source, id) of an encoded event, or None if it has none a confirmation could name (metering
    dead-letters such an event without a key; the broker's ack is all there is to wait for)."""
    try:
        found = _identity.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(found.source, str) and isinstance(found.id, str) and found.source and found.id:
        return found.source, found.id
    return None


def identity_of(event: Any) -> Key:
    """(source, id) of a decoded event (a dict), NO_IDENTITY if it has none."""
    if isinstance(event, dict):
        source, event_id = event.get("source"), event.get("id")
        if isinstance(source, str) and isinstance(event_id, str) and source and event_id:
            return source, event_id
    return NO_IDENTITY


__all__ = ["NO_IDENTITY", "Key", "event_identity", "identity_of"]
