"""Predictions at admission: each request is predicted from the newest stored fit, by a lookup.

The predictors are fitted by prediction_service (`infermeter predict fit`, and `infermeter up`'s
schedule) and stored in `prediction_fits`, one version per fit (docs/prediction.md). The gateway
holds the newest fit's request table (`prediction.RequestModel`) in memory: `AdmissionPredictor`

- `predict(customer_id, model, prompt_tokens, max_tokens, task_id, attempt)` -> `Prediction | None`:
  the table's lookup (`RequestModel.predict_request`, <= 10 us CPU, `python -m bench.prediction`),
  with the fit's version; every output figure read from it is capped at `max_tokens`. None while no fit exists: the request then has no
  prediction (its event carries no `prediction` field, its predictive budget reserves `max_tokens`).
  The request's `prefix_seen` is not known at admission (the router decides it later), so the
  prediction reads the "unknown" row of its cell.
- `reload()` asks the database for a fit newer than the one held (one indexed row, `version >` the
  held one) and swaps it in; `start()` runs it every `reload_s` seconds in a thread (and once at
  once), so no request ever waits for the database. A failed reload is logged; the held table stays.

The gateway may not import prediction_service (the import contract: serving sits below it), so it
reads the newest fit's request table here itself: `newest_request_model(conn, newer_than)` reads
`version` and `state->'requests'` of `prediction_fits` (the table of prediction_service/tables.py,
the state written by `prediction_service.store.fit`) and decodes it with `RequestModel.from_state`.

`Prediction.to_event()` is the request event's `prediction` object (additive in `request.v1`):
`{"model_version", "output_tokens_p50", "output_tokens_p90", "output_tokens_p99", "cached_fraction",
"failure_probability"}`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from infermeter.periodic import Periodic
from prediction.request import RequestModel, RequestPrediction

log = logging.getLogger("serving.predictions")

DEFAULT_RELOAD_S = 30.0

_NEWEST_SQL = text(
    "SELECT version, state->'requests' AS requests FROM prediction_fits "
    "WHERE version > :newer_than ORDER BY version DESC LIMIT 1"
)


def newest_request_model(conn, newer_than: int = 0) -> tuple[int, RequestModel] | None:
    """The newest fit's (version, request table) if its version is above `newer_than`, else None.
    `conn` is a SQLAlchemy connection."""
    row = conn.execute(_NEWEST_SQL, {"newer_than": newer_than}).first()
    if row is None:
        return None
    return int(row.version), RequestModel.from_state(row.requests)


def _event_of(model_version: int, p: RequestPrediction) -> dict[str, Any]:
    """The `prediction` object of a request's event (metering.contract's `AdmissionPrediction`), its
    output figures as given (capped by the caller), the rates kept inside [0, 1] whatever history the
    fit saw, so that the event is never refused for its prediction."""
    return {"model_version": model_version, "output_tokens_p50": p.output_tokens_p50,
            "output_tokens_p90": p.output_tokens_p90, "output_tokens_p99": p.output_tokens_p99,
            "cached_fraction": min(max(p.cached_fraction, 0.0), 1.0),
            "failure_probability": min(max(p.failure_probability, 0.0), 1.0)}


class Prediction:
    """A request's prediction at admission: the table's prediction for its features, the version of
    the fit it came from, and the request's `max_tokens` (None: none given), which caps every output
    figure (the engine stops there, `RequestPrediction.capped`). Immutable, made once and shared:
    `AdmissionPredictor` keeps one per table row and `max_tokens`, so a request's prediction is two
    dict lookups and no allocation."""

    __slots__ = ("_event", "max_tokens", "model_version", "output_tokens_p50", "output_tokens_p99", "request")

    def __init__(self, model_version: int, request: RequestPrediction, max_tokens: int | None = None) -> None:
        self.model_version = model_version
        self.request = request
        self.max_tokens = max_tokens
        shown = request if max_tokens is None else request.capped(max_tokens)
        self.output_tokens_p50 = shown.output_tokens_p50
        self.output_tokens_p99 = shown.output_tokens_p99
        self._event = _event_of(model_version, shown)

    def __repr__(self) -> str:
        return f"Prediction({self.model_version!r}, {self.request!r}, max_tokens={self.max_tokens!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Prediction):
            return NotImplemented
        return (self.model_version, self.request, self.max_tokens) == (
            other.model_version, other.request, other.max_tokens)

    __hash__ = None  # type: ignore[assignment]

    def to_event(self) -> dict[str, Any]:
        """The `prediction` object of the request's `request.v1` event (see `_event_of`), shared by
        every request with this prediction: read it, do not change it (`metering.contract.request_event`
        copies it into the event)."""
        return self._event


SHARED_MAX = 65_536  # shared predictions kept per fit (table rows x the max_tokens seen), then started afresh


Loader = Callable[[int], "tuple[int, RequestModel] | None"]


class AdmissionPredictor(Periodic):
    """The newest fit's request table, reloaded when a new version appears (see the module doc).
    `load(newer_than)` answers (version, table) of a newer fit or None; `engine_loader(engine)` makes
    it from a SQLAlchemy engine."""

    thread_name = "admission-predictor"

    def __init__(self, load: Loader, *, reload_s: float = DEFAULT_RELOAD_S) -> None:
        super().__init__()
        self._load = load
        self.interval_s = reload_s
        # (version, table, the shared predictions by (row id, cap)) of the fit held, swapped as one
        # object so a request never pairs one fit's table with another's version; None: no fit yet
        self._held: tuple[int, RequestModel, dict[tuple[int, int | None], Prediction]] | None = None
        self.reloads = 0

    @property
    def held(self) -> tuple[int, RequestModel] | None:
        """(version, table) of the fit held; None: no fit yet."""
        held = self._held
        return None if held is None else held[:2]

    @held.setter
    def held(self, found: tuple[int, RequestModel] | None) -> None:
        if found is None:
            self._held = None
            return
        version, table = found
        # every row's prediction without max_tokens made now, under a max_tokens when first asked.
        # The table (held with them) keeps its rows alive, so their ids stay theirs.
        self._held = (version, table, {(id(p), None): Prediction(version, p) for p in table.predictions()})

    @property
    def version(self) -> int:
        """The version of the fit held (0: none)."""
        held = self.held
        return 0 if held is None else held[0]

    @classmethod
    def on_engine(cls, engine, *, reload_s: float = DEFAULT_RELOAD_S) -> AdmissionPredictor:
        def load(newer_than: int) -> tuple[int, RequestModel] | None:
            with engine.connect() as conn:
                return newest_request_model(conn, newer_than)

        return cls(load, reload_s=reload_s)

    def reload(self) -> bool:
        """Take the newest fit if it is newer than the one held; True when it changed."""
        found = self._load(self.version)
        if found is None:
            return False
        self.held = found
        self.reloads += 1
        log.info("predictions at admission now from fit version %s (%s requests)", found[0], found[1].rows)
        return True

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.reload()
            except Exception:  # the database may be away for a while: keep the table held, try again
                log.exception("reloading the predictors failed; predicting from fit version %s", self.version)
            self.stop_event.wait(self.interval_s)

    def predict(self, customer_id: str, model: str, prompt_tokens: int, max_tokens: int | None,
                task_id: str | None = None, attempt: int = 1) -> Prediction | None:
        held = self._held
        if held is None:
            return None
        version, table, shared = held
        # uncapped lookup (prefix_seen unknown at admission); the prediction under its cap, shared
        row = table.lookup(customer_id, model, prompt_tokens)
        key = (id(row), max_tokens)
        prediction = shared.get(key)
        if prediction is None:
            if len(shared) >= SHARED_MAX:  # many distinct max_tokens: start afresh (made again when asked)
                shared.clear()
            prediction = shared[key] = Prediction(version, row, max_tokens)
        return prediction
