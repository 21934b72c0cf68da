"""The quantile rank: the order statistic that covers a new value with probability >= q."""

import pytest

from prediction.quantiles import Quantiles, rank


@pytest.mark.parametrize(("q", "n", "expected"), [
    (0.5, 1, 1), (0.5, 2, 2), (0.5, 3, 2), (0.9, 9, 9), (0.9, 10, 10), (0.9, 29, 27), (0.9, 30, 28),
    (0.99, 98, 98), (0.99, 99, 99), (0.99, 199, 198), (0.99, 200, 199), (0.1, 9, 1), (0.1, 10, 2),
])
def test_rank_is_ceil_q_n_plus_one_capped(q, n, expected):
    assert rank(q, n) == expected


def test_rank_covers_a_new_value_at_least_q():
    for n in range(1, 400):
        for q in (0.1, 0.5, 0.9, 0.99):
            k = rank(q, n)
            assert k / (n + 1) >= q or k == n


def test_quantiles_grow_sorted():
    values = Quantiles([5, 1, 3])
    values.add(2)
    values.add(4)
    assert values.values == [1, 2, 3, 4, 5]
    assert values.median() == 3 and values.quantile(0.9) == 5 and len(values) == 5
    with pytest.raises(IndexError):
        Quantiles().quantile(0.5)
