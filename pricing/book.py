"""Price books: typed, validated, exact.

A price book is a YAML document (see docs/pricing.md):

    id: tokens-2026-11
    currency: USD
    charges:
      - meter: output_tokens
        model: big-model                       # optional: this model only
        price: {type: unit, amount: "2.40", per: 1000000}
    minimum: "100.00"                          # optional per-period commitment
    credits: "0"                               # optional prepaid credits applied each period
    task_outcomes:                             # optional: the task outcomes the task meters believe
      trusted_sources: ["//verifier/"]
      task_timeout: 24h
      untrusted_outcome: bill_as_success
    invoice:                                   # optional: how invoice lines are laid out
      group_by: project                        # one line per project of each request-meter line

Amounts are decimal strings (the documented form). A bare YAML number such as `0.1` is also
accepted, but is read from its source text exactly (never through a binary float). Any amount
with more than 12 decimal places (the project-wide NUMERIC scale) is refused.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pricing.meters import BUILTIN_METERS, GPU_METER, REQUEST_METERS, TASK_METERS, USAGE_PREFIX
from pricing.money import Currency, exact_decimal


def _amount(value: Any) -> Decimal:
    return exact_decimal(value, what="amount")


def _quantity(value: Any) -> Decimal:
    return exact_decimal(value, what="quantity")


Amount = Annotated[Decimal, BeforeValidator(_amount)]
QuantityValue = Annotated[Decimal, BeforeValidator(_quantity)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UnitPrice(_Strict):
    """`amount` for every `per` units, in proportion (3.50 per 3600 GPU-seconds)."""

    type: Literal["unit"]
    amount: Amount = Field(ge=0)
    per: QuantityValue = Field(gt=0)


class Tier(_Strict):
    """Units up to `up_to` (inclusive; null = no upper bound) cost `amount` per `per` units,
    plus an optional `flat_amount` once when the tier is reached."""

    up_to: QuantityValue | None = Field(gt=0)
    amount: Amount = Field(default=Decimal(0), ge=0)
    flat_amount: Amount = Field(default=Decimal(0), ge=0)


def _check_tiers(tiers: list[Tier]) -> list[Tier]:
    if not tiers:
        raise ValueError("at least one tier is needed")
    for i, tier in enumerate(tiers[:-1]):
        if tier.up_to is None:
            raise ValueError(f"tier {i + 1} has up_to null but is not the last tier (only the last may be open)")
        following = tiers[i + 1].up_to
        if following is not None and following <= tier.up_to:
            raise ValueError(
                f"tiers overlap or are out of order: tier {i + 2} up_to {following} is not above "
                f"tier {i + 1} up_to {tier.up_to}"
            )
    if tiers[-1].up_to is not None:
        raise ValueError("the last tier must have up_to null (it covers everything above the previous tier)")
    return tiers


class TieredGraduatedPrice(_Strict):
    """Each tier prices only the units that fall inside it."""

    type: Literal["tiered_graduated"]
    tiers: list[Tier]
    per: QuantityValue = Field(default=Decimal(1), gt=0)

    _tiers = field_validator("tiers")(classmethod(lambda cls, v: _check_tiers(v)))


class TieredVolumePrice(_Strict):
    """The tier the whole quantity falls in prices every unit."""

    type: Literal["tiered_volume"]
    tiers: list[Tier]
    per: QuantityValue = Field(default=Decimal(1), gt=0)

    _tiers = field_validator("tiers")(classmethod(lambda cls, v: _check_tiers(v)))


class PackagePrice(_Strict):
    """`amount` for each started package of `per` units (a partial package costs a whole one)."""

    type: Literal["package"]
    amount: Amount = Field(ge=0)
    per: QuantityValue = Field(gt=0)


class FlatPrice(_Strict):
    """`amount` once per period in which the meter has any usage."""

    type: Literal["flat"]
    amount: Amount = Field(ge=0)


Price = Annotated[
    UnitPrice | TieredGraduatedPrice | TieredVolumePrice | PackagePrice | FlatPrice,
    Field(discriminator="type"),
]
PRICE_TYPES = ("unit", "tiered_graduated", "tiered_volume", "package", "flat")


class Charge(_Strict):
    meter: str
    price: Price
    model: str | None = None
    deployment: str | None = None
    gpu_type: str | None = None
    free: QuantityValue = Field(default=Decimal(0), ge=0, description="free allowance per period and line")
    key: str | None = Field(default=None, description="stable key; default: meter and selectors")
    description: str | None = None

    @field_validator("meter")
    @classmethod
    def _known_meter(cls, meter: str) -> str:
        if meter in BUILTIN_METERS:
            return meter
        if meter.startswith(USAGE_PREFIX) and len(meter) > len(USAGE_PREFIX):
            return meter
        raise ValueError(
            f"unknown meter {meter!r}: expected one of {', '.join(BUILTIN_METERS)} "
            f"or '{USAGE_PREFIX}<name>' for an infermeter.usage.v1 meter"
        )

    @model_validator(mode="after")
    def _selectors_fit_meter(self) -> Charge:
        if self.model is not None and self.meter not in REQUEST_METERS:
            raise ValueError(f"`model` only applies to {', '.join(REQUEST_METERS)}, not {self.meter}")
        if self.deployment is not None and self.meter not in (*REQUEST_METERS, GPU_METER):
            raise ValueError(f"`deployment` only applies to request meters and {GPU_METER}, not {self.meter}")
        if self.gpu_type is not None and self.meter != GPU_METER:
            raise ValueError(f"`gpu_type` only applies to {GPU_METER}, not {self.meter}")
        return self

    @property
    def selector(self) -> tuple[str, str | None, str | None, str | None]:
        return (self.meter, self.model, self.deployment, self.gpu_type)

    @property
    def stable_key(self) -> str:
        if self.key:
            return self.key
        parts = [self.meter]
        for name, value in (("model", self.model), ("deployment", self.deployment), ("gpu_type", self.gpu_type)):
            if value is not None:
                parts.append(f"{name}={value}")
        return ";".join(parts)

    @property
    def specificity(self) -> int:
        return sum(v is not None for v in (self.model, self.deployment, self.gpu_type))


UNTRUSTED_OUTCOME_RULES = ("bill_as_success", "bill_as_failure", "not_billed")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(value: Any) -> int:
    """A duration as whole seconds: an integer of seconds, or a string `<n>s|m|h|d` ("24h")."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as '24h', '90m', '3600s', '2d'")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value[:-1].isdigit() and value[-1:] in _DURATION_UNITS:
        seconds = int(value[:-1]) * _DURATION_UNITS[value[-1]]
    elif isinstance(value, str) and value.isdigit():
        seconds = int(value)
    else:
        raise ValueError(f"{value!r} is not a duration: give seconds or a string such as '24h', '90m', '3600s', '2d'")
    if seconds <= 0:
        raise ValueError("a task timeout must be longer than zero")
    return seconds


class TaskOutcomeTrust(_Strict):
    """Which task outcomes a book believes (docs/billing.md, "Trusted task outcomes").

    A task counts at its latest outcome from a trusted source (a source equal to an entry of
    `trusted_sources` or starting with it) whose `finished_at` is before its deadline, the first
    request of the task plus `task_timeout`. A task with attempts and no such outcome is billed at
    its deadline by `untrusted_outcome`: as a success, as a failure, or not at all."""

    trusted_sources: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    task_timeout: Annotated[int, BeforeValidator(_seconds)] = Field(description="seconds from the task's first request")
    untrusted_outcome: Literal["bill_as_success", "bill_as_failure", "not_billed"]

    def trusts(self, source: str) -> bool:
        return source.startswith(tuple(self.trusted_sources))


INVOICE_GROUPINGS = ("project",)


class InvoiceLayout(_Strict):
    """How a book's invoices lay out their lines (docs/pricing.md, "Invoice lines by project").

    `group_by: project`: each usage line of a request meter (tokens, requests) is split into one line
    per project of its usage (the API key's project; '' for requests made without one). The line is
    rated as a whole first; its amount is then shared over its projects in proportion to their
    quantities (`pricing.split.split_by_quantity`), so the project lines add up to it exactly. Flat
    charges, meters without projects (GPU time, tasks, usage meters), the minimum and credits stay
    whole lines without a project. Absent (the default): lines are not split."""

    group_by: Literal["project"] | None = None


class PriceBook(_Strict):
    id: str = Field(min_length=1)
    currency: str
    charges: list[Charge] = Field(min_length=1)
    minimum: Amount | None = Field(default=None, ge=0)
    credits: Amount | None = Field(default=None, ge=0)
    task_outcomes: TaskOutcomeTrust | None = None
    invoice: InvoiceLayout | None = None
    name: str | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _trust_needs_task_meters(self) -> PriceBook:
        if self.task_outcomes is not None and not any(c.meter in TASK_METERS for c in self.charges):
            raise ValueError(
                f"task_outcomes applies to the task meters ({', '.join(TASK_METERS)}); this book prices none"
            )
        return self

    @field_validator("currency")
    @classmethod
    def _known_currency(cls, code: str) -> str:
        Currency.of(code)  # raises UnknownCurrency (a ValueError) with the list of known codes
        return code

    @model_validator(mode="after")
    def _no_duplicate_charges(self) -> PriceBook:
        seen: dict[str, int] = {}
        for i, charge in enumerate(self.charges):
            key = charge.stable_key
            if key in seen:
                raise ValueError(f"charges[{i}] duplicates charges[{seen[key]}] (same meter and selectors: {key})")
            seen[key] = i
        return self

    @property
    def money(self) -> Currency:
        return Currency.of(self.currency)

    @property
    def lines_by_project(self) -> bool:
        """True when the book's invoice lines of request meters are split by project."""
        return self.invoice is not None and self.invoice.group_by == "project"


class PriceBookError(ValueError):
    """A price book that cannot be used: names the file, the field path and the reason."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {path or '(top level)'}: {reason}" for path, reason in problems))


# ---------------------------------------------------------------- YAML, exactly


class _ExactLoader(yaml.SafeLoader):
    """SafeLoader whose floats are Decimals read from the source text (no binary float ever)."""


def _construct_exact_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Decimal:
    text = loader.construct_scalar(node).replace("_", "")
    try:
        value = Decimal(text)
    except ArithmeticError:
        value = None
    if value is None or not value.is_finite():
        mark = node.start_mark
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a finite decimal number", mark
        )
    return value


_ExactLoader.add_constructor("tag:yaml.org,2002:float", _construct_exact_float)


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    previous = None
    for part in loc:
        if previous == "price" and part in PRICE_TYPES:
            previous = part
            continue  # the discriminator tag pydantic adds to the location
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
        previous = part
    return out


def _reason(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    message = str(error.get("msg", ""))
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (not part of a price book)"
    if kind == "union_tag_invalid":
        return f"unknown price type; expected one of {', '.join(PRICE_TYPES)}"
    if kind == "union_tag_not_found":
        return f"price needs a `type`: one of {', '.join(PRICE_TYPES)}"
    return message.removeprefix("Value error, ")


def parse_price_book(text: str, source: str = "<price book>") -> PriceBook:
    """Parse and validate a YAML price book; raise PriceBookError naming source, field and reason."""
    try:
        data = yaml.load(text, Loader=_ExactLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PriceBookError(source, [("", f"not valid YAML: {exc}")]) from None
    return price_book_from_data(data, source)


def price_book_from_data(data: Any, source: str = "<price book>") -> PriceBook:
    if not isinstance(data, dict):
        raise PriceBookError(source, [("", "a price book is a mapping with id, currency and charges")])
    try:
        return PriceBook.model_validate(data)
    except ValidationError as exc:
        problems = [(_path(tuple(e["loc"])), _reason(e)) for e in exc.errors()]
        raise PriceBookError(source, problems) from None


def price_book_to_data(book: PriceBook) -> dict[str, Any]:
    """JSON-ready dict of a book with amounts as decimal strings (round-trips through parse).

    Nulls are kept: a tier's `up_to: null` is what makes it the open last tier. A book without an
    `invoice` layout has no `invoice` key (its document is as before the option existed)."""
    data = book.model_dump(mode="json")
    if book.invoice is None:
        del data["invoice"]
    return data
