"""The edges `billing.periods.billing_period`'s cache of cut periods could hide: the last period the
calendar allows cut afresh (not read back from the cache), and the cache's bound."""

from __future__ import annotations

from datetime import UTC, datetime

from billing import periods
from billing.periods import MAX_YEAR, _billing_period, billing_period


def test_the_last_period_the_calendar_allows_cut_afresh():
    # called past the cache: "9998-12" ends in MAX_YEAR + 1, the one year past MAX_YEAR allowed
    last = _billing_period(f"{MAX_YEAR}-12", "UTC", 1)
    assert (last.start, last.end) == (datetime(MAX_YEAR, 12, 1, tzinfo=UTC), datetime(MAX_YEAR + 1, 1, 1, tzinfo=UTC))
    before = _billing_period(f"{MAX_YEAR - 1}-12", "UTC", 1)
    assert before.end == datetime(MAX_YEAR, 1, 1, tzinfo=UTC)


def test_the_cache_of_cut_periods_never_holds_more_than_4096():
    periods._PERIODS.clear()
    for n in range(4097):  # one more than the bound: the 4097th empties the cache first
        year, month = divmod(n, 12)
        billing_period(f"{2000 + year % 900}-{month + 1:02d}", "UTC", 1)
        assert len(periods._PERIODS) <= 4096
    assert len(periods._PERIODS) == 1
    periods._PERIODS.clear()
