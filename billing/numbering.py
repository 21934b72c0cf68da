"""Invoice numbers: "INV-2026-000123" = issuer prefix, year, sequence (at least six digits).

Only formatting and parsing live here. Handing out the next number without gaps is the database
adapter's job (a counter row per prefix and year, taken in the transaction that finalizes the
invoice); `gaps` checks a run of numbers for holes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from billing.errors import NumberingError

DEFAULT_PREFIX = "INV"
SEQUENCE_DIGITS = 6
_PREFIX = re.compile(r"[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*")
_NUMBER = re.compile(r"(?P<prefix>.+)-(?P<year>\d{4})-(?P<seq>\d{6,})")
MAX_PREFIX_LENGTH = 20
_VALID_PREFIXES: set[str] = set()  # prefixes already checked (a billing run numbers 10^4 invoices with one)


@dataclass(frozen=True, order=True)
class InvoiceNumber:
    prefix: str
    year: int
    seq: int

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if not isinstance(self.year, int) or isinstance(self.year, bool) or not 1000 <= self.year <= 9999:
            raise NumberingError(f"invoice number year {self.year!r} must be a four-digit year")
        if not isinstance(self.seq, int) or isinstance(self.seq, bool) or self.seq < 1:
            raise NumberingError(f"invoice number sequence {self.seq!r} must be a whole number from 1")

    def __str__(self) -> str:
        return f"{self.prefix}-{self.year:04d}-{self.seq:0{SEQUENCE_DIGITS}d}"


def check_prefix(prefix: object) -> str:
    if type(prefix) is str and prefix in _VALID_PREFIXES:
        return prefix
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or len(prefix) > MAX_PREFIX_LENGTH:
        raise NumberingError(
            f"issuer prefix {prefix!r} is not valid: use upper-case letters and digits, starting with a "
            f"letter, optionally in hyphen-separated parts (e.g. 'INV' or 'ACME-EU'), at most "
            f"{MAX_PREFIX_LENGTH} characters"
        )
    if type(prefix) is str and len(_VALID_PREFIXES) < 256:
        _VALID_PREFIXES.add(prefix)
    return prefix


def format_number(year: int, seq: int, issuer_prefix: str = DEFAULT_PREFIX) -> str:
    """format_number(2026, 123) -> "INV-2026-000123" (a sequence past 999999 gets more digits)."""
    return str(InvoiceNumber(issuer_prefix, year, seq))


def parse_number(text: object) -> InvoiceNumber:
    """The parts of an invoice number written by `format_number`; NumberingError otherwise."""
    if not isinstance(text, str):
        raise NumberingError(f"invoice number must be a string, got {type(text).__name__}")
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise NumberingError(
            f"invoice number {text!r} is not of the form PREFIX-YYYY-NNNNNN (e.g. 'INV-2026-000123')"
        )
    seq_text = match.group("seq")
    if len(seq_text) > SEQUENCE_DIGITS and seq_text.startswith("0"):
        raise NumberingError(f"invoice number {text!r} has a zero-padded sequence longer than {SEQUENCE_DIGITS} digits")
    number = InvoiceNumber(match.group("prefix"), int(match.group("year")), int(seq_text))
    if str(number) != text:  # pragma: no cover - the pattern and the format agree
        raise NumberingError(f"invoice number {text!r} is not in canonical form ({number})")
    return number


def gaps(numbers: Iterable[str]) -> list[tuple[str, int, int]]:
    """Missing sequences per (prefix, year) among `numbers` from 1 up to the highest seen:
    [(prefix, year, missing seq), ...] sorted; duplicates raise NumberingError."""
    seen: dict[tuple[str, int], set[int]] = {}
    for text in numbers:
        number = parse_number(text)
        bucket = seen.setdefault((number.prefix, number.year), set())
        if number.seq in bucket:
            raise NumberingError(f"invoice number {text} is used twice")
        bucket.add(number.seq)
    return [
        (prefix, year, seq)
        for (prefix, year), seqs in sorted(seen.items())
        for seq in range(1, max(seqs) + 1)
        if seq not in seqs
    ]
