"""Which statistics predict a request's output tokens best, measured on the bundled trace.

    pip install -e '.[prediction-study]'       # numpy, scikit-learn, lightgbm, ddsketch: the study only
    python -m bench.prediction_study [--full] [--json]

The demo's month (`app.demo.month.generate`: the Mooncake trace as metered request events) is predicted
two ways, each request only from requests that finished before it was admitted:
- online: every finished request updates the predictor at once (`prediction.backtest`): the
  per-cell quantiles kept exactly (`prediction.quantiles.Quantiles`, what infermeter uses) or in a
  DDSketch (1% relative accuracy);
- refitted: every `--refit-days` days (default 3) from the second day a model is fitted on
  everything finished before and predicts the requests admitted until the next refit: the same
  cells, scikit-learn's HistGradientBoostingRegressor and LightGBM with the quantile loss (one model
  per quantile), and linear quantile regression (scikit-learn QuantileRegressor on log prompt
  tokens, model and task flags; fitted on a 3,000-row sample: the linear program grows fast with
  rows). Features for the learned models: log prompt tokens, customer,
  model, whether the request is part of a task, its attempt.

Printed per method: MAE of p50, pinball loss and coverage of p90 and p99, fit seconds (all refits)
and the CPU per prediction of one request. docs/prediction.md, "Choosing the statistics", keeps
the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import UTC, datetime, timedelta

from prediction.backtest import backtest
from prediction.quantiles import Quantiles
from prediction.request import RequestHistory, RequestObservation, RequestPrediction, fit_requests
from prediction.scoring import Scored, score


def demo_requests(full: bool, seed: int = 7) -> list[RequestObservation]:
    """The demo month's request events as the predictors read them (no database)."""
    from app.demo.month import generate
    from metering.contract import REQUEST_V1, decode_event

    events, _, _ = generate(None if full else 4000, seed)
    now = datetime(2100, 1, 1, tzinfo=UTC)
    out = []
    for raw in events:
        event = decode_event(raw, now=now)
        if event.type != REQUEST_V1:
            continue
        d = event.data
        out.append(RequestObservation(event.source, event.id, d.customer_id, d.model, d.status, d.input_tokens,
                                      d.cached_input_tokens, d.output_tokens, d.started_at, event.time,
                                      d.task_id, d.attempt, None, d.prefix_seen))
    return out


class SketchQuantiles:
    """A DDSketch behind the `Quantiles` interface."""

    __slots__ = ("sketch", "n")

    def __init__(self) -> None:
        from ddsketch import DDSketch

        self.sketch = DDSketch(relative_accuracy=0.01)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, value: float) -> None:
        self.sketch.add(max(value, 0.5))  # the sketch keeps positive values; 0 and 1 token read back ~0.5..1
        self.n += 1

    def quantile(self, q: float) -> float:
        return self.sketch.get_quantile_value(q)


def _scores(rows) -> dict:
    return score(Scored(r.request.customer_id, r.request.model, r.request.status, r.request.output_tokens,
                        r.request.cached_fraction, r.request.failed, r.prediction, r.baseline_p50)
                 for r in rows)["all"]


def online(requests, estimator) -> dict:
    started = time.process_time()
    rows = backtest(requests, online=RequestHistory(estimator))
    return {**_scores(rows), "fit_cpu_s": round(time.process_time() - started, 3)}


class _Tabular:
    """Features of a request for the learned models."""

    def __init__(self, requests):
        self.customers = {c: i for i, c in enumerate(sorted({r.customer_id for r in requests}))}
        self.models = {m: i for i, m in enumerate(sorted({r.model for r in requests}))}

    def row(self, r: RequestObservation) -> list[float]:
        return [math.log1p(r.input_tokens), self.customers.get(r.customer_id, -1), self.models.get(r.model, -1),
                float(r.task_id is not None), float(r.attempt)]


def daily(requests, method: str, refit_days: int = 3) -> dict:
    import numpy as np

    learned = [r for r in requests if r.status != "rejected"]
    learned.sort(key=lambda r: r.finished_at)
    ordered = sorted(requests, key=lambda r: r.started_at)
    first = ordered[0].started_at.replace(hour=0, minute=0, second=0, microsecond=0)
    tab = _Tabular(requests)
    fit_s = 0.0
    predict_s = 0.0
    predictions = 0
    scored = []
    day = first + timedelta(days=1)
    j = 0
    train: list[RequestObservation] = []
    while day <= ordered[-1].started_at:
        while j < len(learned) and learned[j].finished_at < day:
            train.append(learned[j])
            j += 1
        todays = [r for r in ordered if day <= r.started_at < day + timedelta(days=refit_days)]
        if not todays:
            day += timedelta(days=refit_days)
            continue
        t0 = time.process_time()
        if method == "cells":
            table = fit_requests(train)
            fit_s += time.process_time() - t0
            t1 = time.process_time()
            preds = [table.predict_request(r.features) for r in todays]
            predict_s += time.process_time() - t1
            rows = [(p.output_tokens_p50, p.output_tokens_p90, p.output_tokens_p99) for p in preds]
        else:
            x = np.array([tab.row(r) for r in train])
            y = np.array([r.output_tokens for r in train], dtype=float)
            models = [_learner(method, q, x, y) for q in (0.5, 0.9, 0.99)]
            fit_s += time.process_time() - t0
            xt = np.array([tab.row(r) for r in todays])
            t1 = time.process_time()
            cols = [m.predict(xt) for m in models]
            predict_s += time.process_time() - t1
            rows = [tuple(round(max(0.0, v)) for v in triple) for triple in zip(*cols, strict=True)]
            single = xt[:1]
            t2 = time.process_time()
            for m in models:
                m.predict(single)
            predict_single = time.process_time() - t2
        predictions += len(todays)
        for r, (p50, p90, p99) in zip(todays, rows, strict=True):
            p90, p99 = max(p90, p50), max(p99, p90, p50)
            scored.append(Scored(r.customer_id, r.model, r.status, r.output_tokens, r.cached_fraction, r.failed,
                                 RequestPrediction(0, p50, p90, p99, 0.0, 0.0, 0.0, method, 0), 0))
        day += timedelta(days=refit_days)
    out = score(scored)["all"]
    out.pop("baseline_mae_p50", None)
    out.update(fit_cpu_s=round(fit_s, 3))
    if method == "cells":
        out["predict_us"] = round(predict_s / predictions * 1e6, 2)
    else:
        out["predict_us"] = round(predict_single * 1e6, 1)  # one request through the three models
    return out


def _learner(method: str, q: float, x, y):
    if method == "hist_gbm":
        from sklearn.ensemble import HistGradientBoostingRegressor

        return HistGradientBoostingRegressor(loss="quantile", quantile=q, max_iter=200,
                                             categorical_features=[1, 2], random_state=0).fit(x, y)
    if method == "lightgbm":
        import lightgbm

        return lightgbm.LGBMRegressor(objective="quantile", alpha=q, n_estimators=200, verbose=-1,
                                      random_state=0).fit(x, y, categorical_feature=[1, 2])
    if method == "linear_qr":
        import numpy as np
        from sklearn.linear_model import QuantileRegressor

        rng = np.random.default_rng(0)
        keep = rng.choice(len(y), size=min(len(y), 3000), replace=False)
        design = x[:, [0, 2, 3, 4]]

        class _Linear:
            def __init__(self):
                self.model = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(design[keep], y[keep])

            def predict(self, xt):
                return self.model.predict(xt[:, [0, 2, 3, 4]])

        return _Linear()
    raise ValueError(method)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the whole trace (36,093 requests) instead of 12,000")
    parser.add_argument("--refit-days", type=int, default=3, help="days between refits of the refitted methods")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    requests = demo_requests(args.full)
    results = {
        "online: cells, exact quantiles": online(requests, Quantiles),
        "online: cells, DDSketch 1%": online(requests, SketchQuantiles),
    }
    for name, m in results.items():
        print(f"{name}: {m}", file=sys.stderr, flush=True)
    for method in ("cells", "hist_gbm", "lightgbm", "linear_qr"):
        results[f"refit every {args.refit_days} d: {method}"] = daily(requests, method, args.refit_days)
        print(f"{method}: {results[f'refit every {args.refit_days} d: {method}']}", file=sys.stderr, flush=True)
    hot = fit_requests(requests)
    features = [r.features for r in requests[:2000]]
    t0 = time.process_time()
    for _ in range(5):
        for f in features:
            hot.predict_request(f)
    lookup_us = (time.process_time() - t0) / (5 * len(features)) * 1e6
    payload = {"requests": len(requests), "methods": results, "table_lookup_us": round(lookup_us, 3),
               "date": datetime.now(UTC).strftime("%Y-%m-%d")}
    if args.json:
        print(json.dumps(payload, indent=2))
        return
    print(f"{len(requests):,} requests; hot-path table lookup {lookup_us:.2f} us")
    head = ("method", "MAE p50", "pinball p90", "pinball p99", "cov p90", "cov p99", "fit CPU s", "us/pred")
    print(" | ".join(head))
    for name, m in results.items():
        print(" | ".join([name, f"{m['mae_p50']:.1f}", f"{m['pinball_p90']:.2f}", f"{m['pinball_p99']:.2f}",
                          f"{m['coverage_p90']:.3f}", f"{m['coverage_p99']:.3f}", f"{m['fit_cpu_s']:.2f}",
                          str(m.get("predict_us", "-"))]))


if __name__ == "__main__":
    main()
