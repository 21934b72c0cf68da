"""Demand at arrival: what the gateway admitted, per deployment and UTC minute, with its predicted output.

Metering counts a request when it finishes (its event time), so under overload the capacity signal
built from metering alone (serving/capacity_service.py) sees what was served, not what came: queued
requests are invisible until they end, and the signal lags exactly when it matters. The gateway knows
each request when it admits it: `ArrivalDemand.arrive(deployment_id, predicted_output_tokens)` counts
it in the current minute with its predicted p50 output tokens (serving/predictions.py; 0 without a
fit), in memory. `ArrivalFlusher` (serving/capacity_arrivals_store.py) writes each gateway's minutes
to the table `capacity_arrivals_minutely` off the event loop, and every reader of the capacity signal
(each gateway's /metrics gauges, the API, the CLI) sums them over gateways and merges them with
metering's minutes (`merge`): per minute, the larger of the metered and the arrived requests, output
tokens and prompt tokens. The gateway has only a byte bound of a prompt's tokens (up to several times
them), so the arrivals' prompt tokens are estimated as their count x the metered prompt tokens per
request of the window. Under a steady load the two sides agree (metering's actual figures, the outputs
usually above the p50, win); under overload the arrivals do, so the signal rises with the load that
came.

Requests refused at admission (budgets, rate limits) are not counted (as metering leaves rejected
requests out). Minutes older than `keep_min` are dropped. `unflushed()` hands the flusher the minutes
whose counts changed since `flushed` last recorded them as written, each with its full count.

Hot path: one `time.time()`, one dict read and two additions per admitted request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from serving.capacity import Minute

KEEP_MIN = 90  # minutes kept: more than the capacity signal's history (serving/capacity_service.HISTORY_MIN)


class ArrivalDemand:
    """Per (deployment, UTC minute): [requests admitted, predicted output tokens]."""

    __slots__ = ("_clock", "_counts", "_flushed", "_lock", "_minute", "keep_min")

    def __init__(self, *, keep_min: int = KEEP_MIN, clock: Callable[[], float] = time.time) -> None:
        self.keep_min = keep_min
        self._clock = clock  # seconds since the epoch (UTC minutes are whole multiples of 60)
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._minute = 0
        self._lock = threading.Lock()  # the flusher reads on a worker thread
        self._flushed: dict[tuple[str, int], tuple[int, int]] = {}  # the counts last written, per key

    def arrive(self, deployment_id: str, predicted_output_tokens: int = 0) -> None:
        minute = int(self._clock() // 60)
        if minute != self._minute:
            self._roll(minute)
        counts = self._counts.get((deployment_id, minute))
        if counts is None:
            with self._lock:
                counts = self._counts.setdefault((deployment_id, minute), [0, 0])
        counts[0] += 1
        counts[1] += predicted_output_tokens

    def _roll(self, minute: int) -> None:
        with self._lock:
            self._minute = minute
            oldest = minute - self.keep_min
            for key in [k for k in self._counts if k[1] < oldest]:
                del self._counts[key]
            for key in [k for k in self._flushed if k[1] < oldest]:
                del self._flushed[key]

    def oldest_kept(self) -> int:
        """The first UTC minute (minutes since the epoch) the tally keeps now."""
        return int(self._clock() // 60) - self.keep_min

    def unflushed(self) -> list[tuple[str, int, int, int]]:
        """(deployment, minute, requests, predicted output tokens) of every kept minute whose counts
        changed since `flushed` recorded them, with the minute's full counts, sorted. A minute being
        counted while this reads may be read between its two additions: its counts then differ from
        the final ones, so the next call hands it over again."""
        oldest = self.oldest_kept()
        with self._lock:
            items = [(k, (v[0], v[1])) for k, v in self._counts.items() if k[1] >= oldest]
            return sorted((dep, minute, *counts) for (dep, minute), counts in items
                          if self._flushed.get((dep, minute)) != counts)

    def flushed(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        """Record `rows` (from `unflushed`) as written: they are handed over again only once they change."""
        oldest = self.oldest_kept()
        with self._lock:
            for dep, minute, requests, output in rows:
                if minute >= oldest:
                    self._flushed[(dep, minute)] = (requests, output)

    def minutes(self, start: datetime, end: datetime) -> dict[str, list[Minute]]:
        """Per deployment, this process's own minutes of [start, end) with arrivals (requests, output
        tokens); the capacity signal reads every gateway's from the table instead."""
        first, last = int(start.timestamp() // 60), int(end.timestamp() // 60)
        with self._lock:
            items = [(k, tuple(v)) for k, v in self._counts.items() if first <= k[1] < last]
        out: dict[str, list[Minute]] = {}
        for (deployment_id, minute), (requests, output) in sorted(items):
            out.setdefault(deployment_id, []).append(
                Minute(datetime.fromtimestamp(minute * 60, UTC), requests=requests, output_tokens=output))
        return out


def merge(metered: Sequence[Minute], arrived: Sequence[Minute]) -> list[Minute]:
    """Metered minutes with arrivals folded in: per minute the larger requests, output tokens and
    prompt tokens, the arrivals' prompt tokens estimated as their count x the metered prompt tokens
    per request of the whole window (0 when nothing is metered yet). TTFT stays metering's. Minutes
    only one side has are kept as they are."""
    requests = sum(m.requests for m in metered)
    per_request = sum(m.prompt_tokens for m in metered) / requests if requests else 0.0
    by_start = {m.start: m for m in metered}
    for a in arrived:
        prompt = round(a.requests * per_request)
        m = by_start.get(a.start)
        if m is None:
            by_start[a.start] = Minute(a.start, a.requests, prompt, a.output_tokens)
        else:
            by_start[a.start] = Minute(m.start, max(m.requests, a.requests), max(m.prompt_tokens, prompt),
                                       max(m.output_tokens, a.output_tokens), m.ttft_p90_s)
    return [by_start[k] for k in sorted(by_start)]
