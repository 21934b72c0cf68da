"""Per request, from what is known at admission: output tokens (p10, p50, p90, p99 and the mean), the
share of the prompt served from the prefix cache, and the probability that the request fails.

What is learned (docs/prediction.md): every metered request (rejected ones excepted: no engine saw
them) lands in three cells, (customer, model, prompt-size bucket), (model, bucket) and the global cell.
A prediction reads the finest cell that has enough requests: MIN_ROWS for the body (p10, p50, p90, the
mean), MIN_TAIL_ROWS for p99 (a p99 read from fewer values is their maximum, which covers less than
99% of the next request). Rates (failure, cached fraction) are the finest cell's, shrunk towards the
coarser cell's estimate with the weight of PRIOR_ROWS requests; the cached fraction is read for the
request's `prefix_seen` (seen, not seen, unknown) where the history has it.

Two forms of the same statistics:
- `RequestHistory`: online. `add` one request after another, `predict_request` at any point from what
  was added so far (the backtest); `freeze()` makes the lookup table.
- `RequestModel`: the lookup table (a fit's state, kept in the database as `to_state()`): every cell's
  prediction computed once, for each `prefix_seen`. `predict_request` is two dict reads and a cap at
  `max_tokens`: the gateway's hot path (<= 10 us CPU, `python -m bench.prediction`). Both forms answer
  the same for the same history (tests/prediction/test_request.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from prediction.quantiles import Quantiles

FORMAT = 1  # of RequestModel.to_state(); a new format is a new number, read side by side
# Prompt-size buckets: 0 = up to 1,024 tokens, b = (1024 * 2^(b-1), 1024 * 2^b], LAST_BUCKET = above 65,536.
BUCKET_BASE_BITS = 10
LAST_BUCKET = 7
MIN_ROWS = 30
MIN_TAIL_ROWS = 200
PRIOR_ROWS = 50
# A request that did not complete: the engine failed it, or the client went away.
FAILED_STATUSES = frozenset({"error", "cancelled"})
NOT_LEARNED_STATUSES = frozenset({"rejected"})  # refused at admission: nothing to learn about the engine
LEVELS = ("customer_model_bucket", "model_bucket", "global")


def prompt_bucket(prompt_tokens: int) -> int:
    """The prompt-size bucket of a prompt (see LAST_BUCKET)."""
    if prompt_tokens <= 1 << BUCKET_BASE_BITS:
        return 0
    bucket = (prompt_tokens - 1).bit_length() - BUCKET_BASE_BITS
    return bucket if bucket < LAST_BUCKET else LAST_BUCKET


def bucket_label(bucket: int) -> str:
    if bucket == 0:
        return f"<={1 << BUCKET_BASE_BITS}"
    low = 1 << (BUCKET_BASE_BITS + bucket - 1)
    return f">{low}" if bucket == LAST_BUCKET else f"{low + 1}-{low * 2}"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the gateway knows when it admits a request. `prompt_tokens` may be an estimate;
    `task_step` is the request's attempt number within its task (1 outside tasks)."""

    customer_id: str
    model: str
    prompt_tokens: int
    max_tokens: int | None = None
    task_id: str | None = None
    task_step: int = 1
    prefix_seen: bool | None = None


@dataclass(frozen=True, slots=True)
class RequestPrediction:
    """The prediction for one request. `basis` names the cell the body came from (one of LEVELS, or
    "none" without any history) and `rows` how many requests that cell holds."""

    output_tokens_p10: int
    output_tokens_p50: int
    output_tokens_p90: int
    output_tokens_p99: int
    output_tokens_mean: float
    cached_fraction: float
    failure_probability: float
    basis: str
    rows: int

    def capped(self, max_tokens: int) -> RequestPrediction:
        """The same prediction with every output figure at most `max_tokens` (the engine stops there)."""
        cap = max(0, max_tokens)
        return replace(self, output_tokens_p10=min(self.output_tokens_p10, cap),
                       output_tokens_p50=min(self.output_tokens_p50, cap),
                       output_tokens_p90=min(self.output_tokens_p90, cap),
                       output_tokens_p99=min(self.output_tokens_p99, cap),
                       output_tokens_mean=min(self.output_tokens_mean, float(cap)))

    def to_json(self) -> dict[str, Any]:
        return {"output_tokens_p10": self.output_tokens_p10, "output_tokens_p50": self.output_tokens_p50,
                "output_tokens_p90": self.output_tokens_p90, "output_tokens_p99": self.output_tokens_p99,
                "output_tokens_mean": round(self.output_tokens_mean, 3),
                "cached_fraction": round(self.cached_fraction, 6),
                "failure_probability": round(self.failure_probability, 6), "basis": self.basis, "rows": self.rows}


NO_HISTORY = RequestPrediction(0, 0, 0, 0, 0.0, 0.0, 0.0, "none", 0)


@dataclass(frozen=True, slots=True)
class RequestObservation:
    """One metered request event, as the predictors read it (metering's history reads give these)."""

    source: str
    event_id: str
    customer_id: str
    model: str
    status: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    started_at: datetime
    finished_at: datetime  # the event time: when it was metered
    task_id: str | None = None
    attempt: int = 1
    max_tokens: int | None = None
    prefix_seen: bool | None = None

    @property
    def features(self) -> RequestFeatures:
        return RequestFeatures(self.customer_id, self.model, self.input_tokens, self.max_tokens, self.task_id,
                               self.attempt, self.prefix_seen)

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES

    @property
    def cached_fraction(self) -> float:
        return self.cached_input_tokens / self.input_tokens if self.input_tokens else 0.0


class _Cell:
    """What a cell has seen: its outputs (for quantiles), failures, cached fractions (all, and by
    prefix_seen)."""

    __slots__ = ("outputs", "output_sum", "failures", "cached", "by_prefix")

    def __init__(self, estimator: Callable[[], Quantiles] = Quantiles) -> None:
        self.outputs = estimator()
        self.output_sum = 0
        self.failures = 0
        self.cached = [0, 0.0]  # requests with a prompt, sum of their cached fractions
        self.by_prefix = {True: [0, 0.0], False: [0, 0.0]}

    def __len__(self) -> int:
        return len(self.outputs)

    def add(self, obs: RequestObservation) -> None:
        self.outputs.add(obs.output_tokens)
        self.output_sum += obs.output_tokens
        self.failures += obs.failed
        if obs.input_tokens:
            fraction = obs.cached_input_tokens / obs.input_tokens
            self.cached[0] += 1
            self.cached[1] += fraction
            if obs.prefix_seen is not None:
                slot = self.by_prefix[obs.prefix_seen]
                slot[0] += 1
                slot[1] += fraction


def _shrunk(chain: Iterable[tuple[int, float]], start: float | None = None) -> float:
    """A rate along cells from coarse to fine: each (count, sum) shrunk towards the estimate so far
    with the weight of PRIOR_ROWS; the first cell with data starts the chain (unless `start` is given)."""
    estimate = start
    for n, total in chain:
        if estimate is None:
            if n:
                estimate = total / n
            continue
        estimate = (total + PRIOR_ROWS * estimate) / (n + PRIOR_ROWS)
    return estimate or 0.0


def _predict(levels: list[_Cell | None], prefix_seen: bool | None) -> RequestPrediction:
    """The prediction from the cells of a request's three levels (finest first; None = no such cell)."""
    present = [(name, cell) for name, cell in zip(LEVELS, levels, strict=True) if cell is not None and len(cell)]
    if not present:
        return NO_HISTORY
    basis, body = next(((name, cell) for name, cell in present if len(cell) >= MIN_ROWS), present[-1])
    tail = next((cell for _, cell in present if len(cell) >= MIN_TAIL_ROWS), present[-1][1]).outputs
    q = body.outputs
    p50 = round(q.quantile(0.5))
    p10 = min(round(q.quantile(0.1)), p50)
    p90 = max(round(q.quantile(0.9)), p50)
    p99 = max(round(tail.quantile(0.99)), p90)
    coarse_first = [cell for _, cell in reversed(present)]
    failure = _shrunk((len(c), c.failures) for c in coarse_first)
    cached_any = _shrunk(tuple(c.cached) for c in coarse_first)
    if prefix_seen is None:
        cached = cached_any
    else:
        cached = _shrunk((tuple(c.by_prefix[prefix_seen]) for c in coarse_first), start=cached_any)
    return RequestPrediction(p10, p50, p90, p99, body.output_sum / len(body), cached, failure, basis, len(body))


def _cap(prediction: RequestPrediction, max_tokens: int | None) -> RequestPrediction:
    if max_tokens is not None and max_tokens < prediction.output_tokens_p99:
        return prediction.capped(max_tokens)
    return prediction


class RequestHistory:
    """The online form: cells updated one request at a time (see the module doc)."""

    def __init__(self, estimator: Callable[[], Quantiles] = Quantiles) -> None:
        self._cells: dict[tuple, _Cell] = {}
        self._estimator = estimator  # what keeps a cell's outputs (the statistics study tries others)
        self.rows = 0

    def add(self, obs: RequestObservation) -> None:
        if obs.status in NOT_LEARNED_STATUSES:
            return
        bucket = prompt_bucket(obs.input_tokens)
        cells = self._cells
        for key in (("c", obs.customer_id, obs.model, bucket), ("m", obs.model, bucket), ("g",)):
            cell = cells.get(key)
            if cell is None:
                cell = cells[key] = _Cell(self._estimator)
            cell.add(obs)
        self.rows += 1

    def _levels(self, customer_id: str | None, model: str | None, bucket: int) -> list[_Cell | None]:
        cells = self._cells
        return [None if customer_id is None else cells.get(("c", customer_id, model, bucket)),
                None if model is None else cells.get(("m", model, bucket)), cells.get(("g",))]

    def predict_request(self, features: RequestFeatures) -> RequestPrediction:
        """From everything added so far (computed from the cells; the table's answer, without the table)."""
        levels = self._levels(features.customer_id, features.model, prompt_bucket(features.prompt_tokens))
        return _cap(_predict(levels, features.prefix_seen), features.max_tokens)

    def freeze(self) -> RequestModel:
        """The lookup table of everything added so far."""
        def row(customer_id: str | None, model: str | None, bucket: int) -> tuple[RequestPrediction, ...]:
            levels = self._levels(customer_id, model, bucket)
            return tuple(_predict(levels, seen) for seen in (None, True, False))

        customer = {(k[1], k[2], k[3]): row(k[1], k[2], k[3]) for k in self._cells if k[0] == "c"}
        model = {(k[1], k[2]): row(None, k[1], k[2]) for k in self._cells if k[0] == "m"}
        return RequestModel(customer, model, row(None, None, 0), self.rows)


_FIELDS = ("output_tokens_p10", "output_tokens_p50", "output_tokens_p90", "output_tokens_p99",
           "output_tokens_mean", "cached_fraction", "failure_probability", "basis", "rows")


def _to_list(p: RequestPrediction) -> list:
    return [p.output_tokens_p10, p.output_tokens_p50, p.output_tokens_p90, p.output_tokens_p99,
            round(p.output_tokens_mean, 3), round(p.cached_fraction, 6), round(p.failure_probability, 6), p.basis,
            p.rows]


def _from_list(values: list) -> RequestPrediction:
    if len(values) != len(_FIELDS):
        raise ValueError(f"a stored request prediction has {len(_FIELDS)} fields, got {len(values)}")
    p10, p50, p90, p99, mean, cached, failure, basis, rows = values
    return RequestPrediction(int(p10), int(p50), int(p90), int(p99), float(mean), float(cached), float(failure),
                             str(basis), int(rows))


class RequestModel:
    """The lookup table (see the module doc): `predict_request` is the gateway's hot path."""

    __slots__ = ("_customer", "_model", "_global", "rows")

    def __init__(self, customer: Mapping[tuple[str, str, int], tuple[RequestPrediction, ...]],
                 model: Mapping[tuple[str, int], tuple[RequestPrediction, ...]],
                 global_row: tuple[RequestPrediction, ...], rows: int) -> None:
        self._customer = dict(customer)
        self._model = dict(model)
        self._global = global_row
        self.rows = rows

    def predict_request(self, features: RequestFeatures) -> RequestPrediction:
        prediction = self.lookup(features.customer_id, features.model, features.prompt_tokens, features.prefix_seen)
        cap = features.max_tokens
        if cap is not None and cap < prediction.output_tokens_p99:
            return prediction.capped(cap)
        return prediction

    def lookup(self, customer_id: str | None, model: str | None, prompt_tokens: int,
               prefix_seen: bool | None = None) -> RequestPrediction:
        """The table's row for these features, uncapped: `predict_request` without building a
        `RequestFeatures` (the gateway's admission calls this, and caps lazily)."""
        bucket = 0 if prompt_tokens <= 1024 else min(LAST_BUCKET, (prompt_tokens - 1).bit_length() - BUCKET_BASE_BITS)
        row = self._customer.get((customer_id, model, bucket))
        if row is None:
            row = self._model.get((model, bucket), self._global)
        return row[0] if prefix_seen is None else row[1] if prefix_seen else row[2]

    def predictions(self) -> list[RequestPrediction]:
        """Every prediction the table can answer (each cell's three rows)."""
        return [p for row in (*self._customer.values(), *self._model.values(), self._global) for p in row]

    @property
    def cells(self) -> int:
        return len(self._customer) + len(self._model) + 1

    def knows_model(self, model: str) -> bool:
        return any(key[0] == model for key in self._model)

    def models(self) -> list[str]:
        return sorted({key[0] for key in self._model})

    def customers(self) -> list[str]:
        return sorted({key[0] for key in self._customer})

    def to_state(self) -> dict[str, Any]:
        """JSON-ready: the table as stored with a fit (prediction_service)."""
        return {
            "format": FORMAT, "fields": list(_FIELDS), "rows": self.rows,
            "buckets": {"base_tokens": 1 << BUCKET_BASE_BITS, "last": LAST_BUCKET},
            "customer": [[c, m, b, [_to_list(p) for p in row]] for (c, m, b), row in sorted(self._customer.items())],
            "model": [[m, b, [_to_list(p) for p in row]] for (m, b), row in sorted(self._model.items())],
            "global": [_to_list(p) for p in self._global],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RequestModel:
        if state.get("format") != FORMAT:
            raise ValueError(f"request model state format {state.get('format')!r} is not {FORMAT}: refit "
                             "(`infermeter predict fit`)")
        row = lambda values: tuple(_from_list(v) for v in values)  # noqa: E731
        return cls({(c, m, int(b)): row(v) for c, m, b, v in state["customer"]},
                   {(m, int(b)): row(v) for m, b, v in state["model"]}, row(state["global"]), int(state["rows"]))


def fit_requests(observations: Iterable[RequestObservation]) -> RequestModel:
    """The lookup table of a window's requests."""
    history = RequestHistory()
    for obs in observations:
        history.add(obs)
    return history.freeze()
