"""`danube-fast schema ...` against a broker subprocess: register, get, versions, check (its exit code), mode
and delete, in both output formats, and the errors a user meets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from danube_fast.testing.broker import Broker

CLI = [sys.executable, "-m", "danube_fast.cli.main", "schema"]
V1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
V2 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"},
                                                   {"name": "name", "type": "string", "default": ""}]}
BREAKS = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"},
                                                       {"name": "age", "type": "int"}]}


def schema(broker: Broker, *args: str, code: int = 0) -> tuple[str, str]:
    done = subprocess.run([*CLI, *args, "--addr", broker.target], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout, done.stderr


def as_json(broker: Broker, *args: str) -> Any:
    return json.loads(schema(broker, *args, "--output", "json")[0])


def test_register_get_versions_check_mode_delete(broker: Broker, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.avsc"
    v1.write_text(json.dumps(V1))
    first = as_json(broker, "register", "users", "--type", "avro", "--file", str(v1), "--description", "one")
    assert (first["version"], first["new_version"]) == (1, True)
    assert first["fingerprint"].startswith("sha256:")
    again = as_json(broker, "register", "users", "--type", "AVRO", "--definition", json.dumps(V1, indent=2))
    assert (again["schema_id"], again["version"], again["new_version"]) == (first["schema_id"], 1, False)

    out, _ = schema(broker, "check", "users", "--type", "avro", "--definition", json.dumps(V2))
    assert "compatible  True" in out
    _, err = schema(broker, "check", "users", "--type", "avro", "--definition", json.dumps(BREAKS), code=1)
    assert "schema check failed: not compatible: " in err and "'age'" in err
    schema(broker, "check", "users", "--type", "avro", "--definition", json.dumps(BREAKS), "--mode", "none")
    _, err = schema(broker, "register", "users", "--type", "avro", "--definition", json.dumps(BREAKS), code=1)
    assert "schema register failed" in err and "not backward compatible" in err

    v2 = as_json(broker, "register", "users", "--type", "avro", "--definition", json.dumps(V2))
    assert v2["version"] == 2
    got = as_json(broker, "get", "users")
    assert (got["version"], got["latest_version"], got["type"]) == (2, 2, "avro")
    assert json.loads(got["definition"]) == V2 and got["compatibility_mode"] == "backward"
    old = as_json(broker, "get", "users", "--version", "1")
    assert (old["version"], old["description"]) == (1, "one") and json.loads(old["definition"]) == V1
    listed = as_json(broker, "versions", "users")
    assert [v["version"] for v in listed["versions"]] == [1, 2] and listed["subject"] == "users"
    table, _ = schema(broker, "versions", "users")
    assert table.splitlines()[2].split()[:2] == ["VERSION", "SCHEMA"]

    assert as_json(broker, "mode", "users", "none")["compatibility_mode"] == "none"
    assert as_json(broker, "get", "users")["compatibility_mode"] == "none"
    assert as_json(broker, "register", "users", "--type", "avro", "--definition", json.dumps(BREAKS))[
        "version"] == 3
    assert as_json(broker, "delete", "users", "2")["deleted_version"] == 2
    assert [v["version"] for v in as_json(broker, "versions", "users")["versions"]] == [1, 3]


def test_schema_errors_name_the_problem(broker: Broker) -> None:
    _, err = schema(broker, "get", "nobody", code=1)
    assert "schema get failed" in err and "NOT_FOUND" in err and "nobody" in err
    _, err = schema(broker, "register", "bad", "--type", "json_schema", "--definition", '{"type": "nope"}',
                    code=1)
    assert '"nope" is not a JSON Schema type' in err
    _, err = schema(broker, "register", "bad", "--type", "json_schema", "--file", "/no/such/file", code=1)
    assert "cannot read --file" in err
    _, err = schema(broker, "register", "bad", "--type", "xml", "--definition", "x", code=2)
    assert "invalid choice: 'xml'" in err
    _, err = schema(broker, "mode", "bad", "sideways", code=2)
    assert "invalid choice" in err
