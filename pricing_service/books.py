"""Price book files and the price-book store (versions with effective dates in Postgres)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg

from pricing.book import PriceBook, PriceBookError, parse_price_book, price_book_from_data, price_book_to_data
from pricing.cost import CostModel, parse_cost_model

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_BOOKS_DIR = REPO_ROOT / "pricing_books"
EXAMPLE_COST_MODEL = EXAMPLE_BOOKS_DIR / "cost-model.yaml"


def read_price_book(path: Path) -> PriceBook:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PriceBookError(str(path), [("", f"cannot read the file: {exc.strerror or exc}")]) from None
    return parse_price_book(text, str(path))


def book_paths(spec: str | os.PathLike | list | None) -> list[Path]:
    """Book files named by a setting: files or directories (every *.yaml/*.yml in it except
    cost-model.yaml), separated by commas or the OS path separator."""
    if spec is None:
        return book_paths([EXAMPLE_BOOKS_DIR])
    items = spec if isinstance(spec, list) else [p for p in str(spec).replace(os.pathsep, ",").split(",") if p.strip()]
    out: list[Path] = []
    for item in items:
        p = Path(str(item).strip())
        if p.is_dir():
            out += sorted(
                f for f in p.iterdir() if f.suffix in (".yaml", ".yml") and f.name != EXAMPLE_COST_MODEL.name
            )
        else:
            out.append(p)
    return out


def read_cost_model(path: Path | None) -> CostModel:
    path = Path(path) if path else EXAMPLE_COST_MODEL
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        from pricing.cost import CostModelError

        raise CostModelError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    return parse_cost_model(text, str(path))


# ---------------------------------------------------------------- the store


@dataclass(frozen=True)
class StoredVersion:
    book_id: str
    effective_from: datetime
    sha256: str
    source_name: str
    imported_at: datetime


def import_book(conn: psycopg.Connection, path: Path, effective_from: datetime) -> tuple[PriceBook, bool]:
    """Store a validated book version in force from `effective_from`. Importing the same text again
    for the same time is a no-op (returns False); a different text for an existing time is refused."""
    if effective_from.tzinfo is None:
        raise ValueError("--effective-from needs a time zone (e.g. 2026-11-01T00:00:00Z)")
    text = Path(path).read_text(encoding="utf-8")
    book = parse_price_book(text, str(path))
    digest = hashlib.sha256(text.encode()).hexdigest()
    with conn.transaction():
        row = conn.execute(
            "SELECT sha256 FROM price_book_versions WHERE book_id = %s AND effective_from = %s",
            (book.id, effective_from),
        ).fetchone()
        if row is not None:
            if row[0] == digest:
                return book, False
            raise ValueError(
                f"book {book.id!r} already has a different version effective from {effective_from.isoformat()}; "
                "import it with another --effective-from"
            )
        conn.execute(
            "INSERT INTO price_book_versions (book_id, effective_from, document, source_text, source_name, sha256) "
            "VALUES (%s, %s, %s::jsonb, %s, %s, %s)",
            (book.id, effective_from, json.dumps(price_book_to_data(book)), text, str(path), digest),
        )
    return book, True


def list_versions(conn: psycopg.Connection, book_id: str | None = None) -> list[StoredVersion]:
    rows = conn.execute(
        "SELECT book_id, effective_from, sha256, source_name, imported_at FROM price_book_versions "
        "WHERE %(book)s::text IS NULL OR book_id = %(book)s ORDER BY book_id, effective_from",
        {"book": book_id},
    ).fetchall()
    return [StoredVersion(*r) for r in rows]


def book_in_force(conn: psycopg.Connection, book_id: str, at: datetime) -> PriceBook | None:
    """The version of a stored book in force at `at` (the latest effective_from <= at)."""
    row = conn.execute(
        "SELECT document, source_name FROM price_book_versions WHERE book_id = %s AND effective_from <= %s "
        "ORDER BY effective_from DESC LIMIT 1",
        (book_id, at),
    ).fetchone()
    return None if row is None else price_book_from_data(row[0], f"{row[1]} (stored)")
