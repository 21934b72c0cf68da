"""The backtest: metered requests replayed in time order, each predicted from only what was metered
before it.

A request is predicted when it was admitted (`started_at`) from the requests whose events happened
(`finished_at`, the event time) strictly before that instant: a request still running, or one that
finished later, cannot inform it. One pass, online (`RequestHistory`): each finished request is added
once, each prediction reads the cells, so a month of the full demo replays in seconds, not a refit
per row. Beside each prediction the row carries the online per-(customer, model) median the
evaluation compares against (`OnlineMedian`), and what actually happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prediction.quantiles import Quantiles
from prediction.request import NOT_LEARNED_STATUSES, RequestHistory, RequestObservation, RequestPrediction


class OnlineMedian:
    """The baseline: the median output of the customer's earlier requests of the model (the global
    median before its first, 0 before any request at all)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], Quantiles] = {}
        self._all = Quantiles()

    def add(self, customer_id: str, model: str, output_tokens: int) -> None:
        values = self._by_key.get((customer_id, model))
        if values is None:
            values = self._by_key[(customer_id, model)] = Quantiles()
        values.add(output_tokens)
        self._all.add(output_tokens)

    def predict(self, customer_id: str, model: str) -> int:
        values = self._by_key.get((customer_id, model)) or self._all
        return round(values.median()) if len(values) else 0


@dataclass(frozen=True, slots=True)
class BacktestRow:
    """A request of the window, its prediction at admission, the baseline's, and what happened."""

    request: RequestObservation
    prediction: RequestPrediction
    baseline_p50: int

    def to_json(self) -> dict:
        p = self.prediction
        return {"source": self.request.source, "id": self.request.event_id,
                "output_tokens_p50": p.output_tokens_p50, "output_tokens_p90": p.output_tokens_p90,
                "output_tokens_p99": p.output_tokens_p99, "cached_fraction": round(p.cached_fraction, 6),
                "failure_probability": round(p.failure_probability, 6)}


def backtest(window: Sequence[RequestObservation], history: Iterable[RequestObservation] = (), *,
             online: RequestHistory | None = None) -> list[BacktestRow]:
    """One row per request of `window`, in admission order (started_at, then source and id).

    `history` is what was metered before the window (it may overlap in time: only the event times
    count); each window request also becomes history once it has finished. `online` is the empty
    predictor to replay into (default `RequestHistory()`; the statistics study passes others)."""
    learned = sorted([*history, *window], key=lambda r: r.finished_at)
    ordered = sorted(window, key=lambda r: (r.started_at, r.source, r.event_id))
    model = RequestHistory() if online is None else online
    baseline = OnlineMedian()
    rows: list[BacktestRow] = []
    j = 0
    for request in ordered:
        admitted = request.started_at
        while j < len(learned) and learned[j].finished_at < admitted:
            done = learned[j]
            model.add(done)
            if done.status not in NOT_LEARNED_STATUSES:
                baseline.add(done.customer_id, done.model, done.output_tokens)
            j += 1
        rows.append(BacktestRow(request, model.predict_request(request.features),
                                baseline.predict(request.customer_id, request.model)))
    return rows
