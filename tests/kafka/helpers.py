"""Helpers of the Kafka contract suite."""

from __future__ import annotations

import time

from metering import kafka as mk


def consume_until(consumer: mk.Consumer, count: int, timeout_s: float = 30.0) -> list[mk.Message]:
    """Poll until `count` messages arrived (or the time is up), then a little longer to catch extras."""
    messages: list[mk.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(messages) < count and time.monotonic() < deadline:
        messages += consumer.poll_batch(1000, 0.2)
    # Anything beyond `count` would be a duplicate or a stray: give it a chance to show up.
    messages += consumer.poll_batch(1000, 0.3)
    return messages
