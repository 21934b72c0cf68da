"""Sharing a rated amount over the parts of its quantity (the projects of an invoice line). Pure, exact.

A line is rated as a whole (`pricing.rating`); when its book lays invoice lines out by project, its
rounded amount and its precise amount are each shared over the line's projects in proportion to their
quantities, by largest remainder: the rounded amount on the currency's minor unit, the precise amount
on the project scale (10^-12). Each part is the floor of its exact share; the quanta left over go one
each to the largest remainders, ties to the project first in name order ('' — no project — first).
So the parts always add up to the whole exactly, a project without quantity gets nothing, and a
single project gets the whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from pricing.cost import largest_remainder
from pricing.money import EXACT


def split_by_quantity(whole: Decimal, quantities: Mapping[str, Decimal | int], quantum: Decimal) -> dict[str, Decimal]:
    """`whole` (a multiple of `quantum`) shared over the keys of `quantities` in proportion to their
    (non-negative) quantities, by largest remainder on `quantum`; keys in name order. All quantities
    zero: the whole to the first key. ValueError for a whole that is not a multiple of the quantum,
    a negative quantity, or nothing to share a non-zero whole among."""
    units = EXACT.divide(whole, quantum)
    if units != units.to_integral_value():
        raise ValueError(f"{whole} is not a multiple of {quantum}")
    names = sorted(quantities)
    parts = largest_remainder(int(units), [quantities[name] for name in names])
    return {name: EXACT.multiply(part, quantum) for name, part in zip(names, parts, strict=True)}
