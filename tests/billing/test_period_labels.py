"""Period labels at their edges: the first and last years billing periods may have and one past
each, and labels of the wrong type refused with PeriodError naming the type."""

from __future__ import annotations

import re

import pytest

from billing.errors import PeriodError
from billing.periods import billing_period, parse_label


@pytest.mark.parametrize(("label", "parts"), [("1970-05", (1970, 5)), ("9998-05", (9998, 5))])
def test_the_first_and_last_years_of_billing_periods(label, parts):
    assert parse_label(label) == parts
    assert billing_period(label, "UTC", 1).label == label


@pytest.mark.parametrize("label", ["1969-05", "9999-05"])
def test_a_year_just_outside_is_refused(label):
    message = f"period {label!r} has year {label[:4]}: billing periods run from 1970 to 9998"
    with pytest.raises(PeriodError, match=f"^{re.escape(message)}$"):
        parse_label(label)


@pytest.mark.parametrize(("label", "kind"), [(202605, "int"), (["2026-05"], "list"), (None, "NoneType")])
def test_a_label_that_is_not_a_string_is_refused_naming_its_type(label, kind):
    message = f"period must be a string 'YYYY-MM' (e.g. '2026-02'), got {kind}"
    with pytest.raises(PeriodError, match=f"^{re.escape(message)}$"):
        parse_label(label)
