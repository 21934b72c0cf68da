"""Per-request predictions: buckets, fallbacks, the cap, and the lookup table answering exactly what
the online cells answer."""

from __future__ import annotations

import json
import random

import pytest

from prediction.request import (
    MIN_ROWS,
    MIN_TAIL_ROWS,
    NO_HISTORY,
    RequestFeatures,
    RequestHistory,
    RequestModel,
    bucket_label,
    fit_requests,
    prompt_bucket,
)
from tests.prediction.helpers import obs, random_history


@pytest.mark.parametrize(("tokens", "bucket"), [
    (0, 0), (1, 0), (1024, 0), (1025, 1), (2048, 1), (2049, 2), (4096, 2), (4097, 3), (32768, 5), (32769, 6),
    (65536, 6), (65537, 7), (10**7, 7),
])
def test_prompt_buckets_double_from_1024(tokens, bucket):
    assert prompt_bucket(tokens) == bucket


def test_bucket_labels():
    assert [bucket_label(b) for b in (0, 1, 2, 7)] == ["<=1024", "1025-2048", "2049-4096", ">65536"]


def test_no_history_predicts_nothing():
    assert RequestHistory().predict_request(RequestFeatures("c", "m", 10)) == NO_HISTORY
    assert fit_requests([]).predict_request(RequestFeatures("c", "m", 10)) == NO_HISTORY


def test_a_cell_answers_once_it_has_min_rows_else_the_coarser_one():
    history = RequestHistory()
    for i in range(MIN_ROWS):  # another customer: 1000-token outputs
        history.add(obs(i, customer="big", output=1000))
    for i in range(MIN_ROWS - 1):  # c1: 10-token outputs, one short of its own cell
        history.add(obs(1000 + i, customer="c1", output=10))
    p = history.predict_request(RequestFeatures("c1", "m1", 500))
    assert p.basis == "model_bucket" and p.rows == 2 * MIN_ROWS - 1
    history.add(obs(2000, customer="c1", output=10))
    p = history.predict_request(RequestFeatures("c1", "m1", 500))
    assert (p.basis, p.rows, p.output_tokens_p50, p.output_tokens_p90) == ("customer_model_bucket", MIN_ROWS, 10, 10)
    # p99 needs MIN_TAIL_ROWS: it still comes from the whole model's cell (which holds the 1000s)
    assert p.output_tokens_p99 == 1000
    # an unknown customer reads the model's cell; an unknown model the global one
    assert history.predict_request(RequestFeatures("new", "m1", 500)).basis == "model_bucket"
    assert history.predict_request(RequestFeatures("new", "other", 500)).basis == "global"


def test_p99_from_the_customer_cell_at_min_tail_rows():
    history = RequestHistory()
    for i in range(MIN_TAIL_ROWS):
        history.add(obs(i, output=i))
    history.add(obs(10_000, customer="c2", output=10**6))
    p = history.predict_request(RequestFeatures("c1", "m1", 500))
    assert p.output_tokens_p99 == 198  # rank ceil(0.99 x 201) = 199 of 0..199
    assert p.output_tokens_p10 <= p.output_tokens_p50 <= p.output_tokens_p90 <= p.output_tokens_p99


def test_max_tokens_caps_every_output_figure():
    history = RequestHistory()
    for i in range(300):
        history.add(obs(i, output=i * 10))
    free = history.predict_request(RequestFeatures("c1", "m1", 500))
    capped = history.predict_request(RequestFeatures("c1", "m1", 500, max_tokens=2000))
    assert free.output_tokens_p90 > 2000
    assert capped.output_tokens_p99 == capped.output_tokens_p90 == 2000
    assert capped.output_tokens_p50 == free.output_tokens_p50 and capped.output_tokens_mean == free.output_tokens_mean
    assert history.predict_request(RequestFeatures("c1", "m1", 500, max_tokens=10**6)) == free
    tiny = history.predict_request(RequestFeatures("c1", "m1", 500, max_tokens=1))
    assert (tiny.output_tokens_p10, tiny.output_tokens_p99, tiny.output_tokens_mean) == (1, 1, 1.0)


def test_failure_and_cached_fraction_shrink_to_the_coarser_cell():
    history = RequestHistory()
    for i in range(1000):
        history.add(obs(i, customer="other", status="error" if i % 10 == 0 else "ok", prompt=1000, cached=500))
    for i in range(50):  # c1 never failed and never hit the cache, in 50 requests
        history.add(obs(5000 + i, prompt=1000, cached=0))
    p = history.predict_request(RequestFeatures("c1", "m1", 1000))
    model_failure = 100 / 1050
    assert p.failure_probability == pytest.approx((0 + 50 * ((100 + 50 * 100 / 1050) / 1100)) / 100, rel=1e-9)
    assert 0 < p.failure_probability < model_failure
    assert 0 < p.cached_fraction < 0.5


def test_cached_fraction_follows_prefix_seen():
    history = RequestHistory()
    for i in range(200):
        history.add(obs(i, prompt=1000, cached=900, prefix_seen=True))
        history.add(obs(1000 + i, prompt=1000, cached=0, prefix_seen=False))
    seen = history.predict_request(RequestFeatures("c1", "m1", 1000, prefix_seen=True)).cached_fraction
    unseen = history.predict_request(RequestFeatures("c1", "m1", 1000, prefix_seen=False)).cached_fraction
    unknown = history.predict_request(RequestFeatures("c1", "m1", 1000)).cached_fraction
    assert seen > 0.8 and unseen < 0.1 and unknown == pytest.approx(0.45)


def test_rejected_requests_are_not_learned():
    history = RequestHistory()
    history.add(obs(1, status="rejected", output=0))
    assert history.rows == 0 and history.predict_request(RequestFeatures("c1", "m1", 1)) == NO_HISTORY


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_lookup_table_answers_what_the_online_cells_answer(seed):
    history = RequestHistory()
    rows = random_history(seed, 3000)
    for row in rows:
        history.add(row)
    table = history.freeze()
    restored = RequestModel.from_state(json.loads(json.dumps(table.to_state())))
    rng = random.Random(seed)
    for _ in range(2000):
        features = RequestFeatures(rng.choice(["c1", "c2", "c3", "unknown"]), rng.choice(["m1", "m2", "unknown"]),
                                   rng.choice([1, 800, 1500, 5000, 9000, 100000]),
                                   rng.choice([None, 5, 100, 10**6]), None, 1, rng.choice([None, True, False]))
        online = history.predict_request(features)
        assert table.predict_request(features) == online
        stored = restored.predict_request(features)
        assert stored.output_tokens_p99 == online.output_tokens_p99 and stored.basis == online.basis
        assert stored.cached_fraction == pytest.approx(online.cached_fraction, abs=1e-6)
        assert stored.failure_probability == pytest.approx(online.failure_probability, abs=1e-6)


def test_state_of_another_format_is_refused():
    state = fit_requests(random_history(1, 10)).to_state()
    with pytest.raises(ValueError, match="refit"):
        RequestModel.from_state({**state, "format": 99})
