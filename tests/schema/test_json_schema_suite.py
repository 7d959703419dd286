"""The official JSON Schema test suite (draft 2020-12, its required tests) run through the registry's own
paths: each case's schema must register as a definition, and each payload must be accepted or refused as the
suite says. The files are a copy of json-schema-org/JSON-Schema-Test-Suite (json_schema_suite/README.md);
refRemote.json is left out: its schemas name documents on a server, which the registry refuses to fetch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from danube_fast.schema import InvalidSchema, SchemaType
from danube_fast.schema.types import build_definition
from danube_fast.schema.validators import validator_for

SUITE = Path(__file__).parent / "json_schema_suite" / "draft2020-12"
REMOTE = "localhost:1234"  # the suite's remote documents: refused at registration (outside the definition)


def _cases(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", sorted(SUITE.glob("*.json")), ids=lambda p: p.stem)
def test_keyword_suite(path: Path) -> None:
    wrong: list[str] = []
    checked = 0
    for group in _cases(path):
        text = json.dumps(group["schema"]).encode()
        try:
            check = validator_for(build_definition(SchemaType.JSON_SCHEMA, text))
        except InvalidSchema as e:
            if REMOTE in text.decode():
                assert "outside the definition" in str(e) or "Unknown meta-schema" in str(e)
                continue
            wrong.append(f"{group['description']}: schema refused: {e}")
            continue
        for case in group["tests"]:
            refused = check(json.dumps(case["data"]).encode())
            checked += 1
            if (refused is None) != case["valid"]:
                wrong.append(f"{group['description']} / {case['description']}: "
                             f"{'refused: ' + refused if refused else 'accepted'}")
    assert not wrong, "\n".join(wrong)
    # vocabulary.json is all custom metaschemas on the suite's server: refused, as its every group checked.
    assert checked or all(REMOTE in json.dumps(g["schema"]) for g in _cases(path)), "no case of this file ran"


def test_the_suite_is_all_there() -> None:
    names = {p.stem for p in SUITE.glob("*.json")}
    assert {"type", "enum", "const", "uniqueItems", "multipleOf", "if-then-else", "patternProperties",
            "prefixItems", "ref", "required", "properties", "items", "oneOf"} <= names
    assert sum(len(g["tests"]) for p in SUITE.glob("*.json") for g in _cases(p)) > 1000
