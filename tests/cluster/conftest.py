"""Fixtures of the cluster tests: the contract suite's real etcd server and its `store` factory (a fresh
embedded or etcd store per test), reused so that every metadata test runs on both stores."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "contract_fixtures", Path(__file__).resolve().parent.parent / "contract" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)

etcd_server = _contract.etcd_server
etcd = _contract.etcd
store = _contract.store
