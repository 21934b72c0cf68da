"""JSON Schema files of the v1 event contract, generated from the structs in metering.contract.

`python -m metering.schemas` rewrites the files; tests/metering/test_contract.py fails when the
committed files differ from what the structs generate, and parses every example message.
Each file describes the whole CloudEvent of one type. Producers and consumers are listed in
metering/schemas/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from metering.contract import DATA_TYPES, Envelope

SCHEMA_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = SCHEMA_DIR / "examples"


def schema_path(type_name: str) -> Path:
    return SCHEMA_DIR / f"{type_name}.schema.json"


def build_schema(type_name: str) -> dict:
    (envelope_schema, data_schema), components = msgspec.json.schema_components(
        [Envelope, DATA_TYPES[type_name]], ref_template="#/$defs/{name}"
    )
    envelope = components["Envelope"]
    envelope["properties"]["type"] = {"const": type_name}
    envelope["properties"]["data"] = data_schema
    defs = {name: body for name, body in components.items() if name != "Envelope"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://infermeter.dev/schemas/{type_name}.schema.json",
        "title": f"{type_name} CloudEvent",
        **envelope,
        "$defs": defs,
    }


def render(type_name: str) -> str:
    return json.dumps(build_schema(type_name), indent=2, sort_keys=True) + "\n"


def write_all() -> list[Path]:
    written = []
    for type_name in DATA_TYPES:
        path = schema_path(type_name)
        path.write_text(render(type_name))
        written.append(path)
    return written
