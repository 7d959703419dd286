"""The TOML sample in broker/config.py's docstring is every setting at its default: loaded, it is
BrokerConfig() where memory is plentiful and what no file at all gives where it is not (its memory settings
say "auto"), and no field of a section's dataclass is missing from it (one place shows every setting)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from danube_fast.broker import config
from danube_fast.broker.memory import UsableMemory

SECTIONS: dict[str, Any] = {"broker": config.BrokerConfig(), **{
    name: getattr(config.BrokerConfig(), name)
    for name in ("wal", "dispatch", "cluster", "tables", "security", "policy")}}
NOT_SETTINGS = {("policy", "extra")}  # keys a stored policy carries that a broker does not set


def sample() -> str:
    doc = config.__doc__ or ""
    start = doc.index("```toml\n") + len("```toml\n")
    return doc[start:doc.index("```", start)]


def test_the_sample_loads_as_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(sample())
    plenty, small = UsableMemory(64 << 30, "physical memory"), UsableMemory(1 << 30, "physical memory")
    assert config.load(str(path), {}, usable=lambda: plenty) == config.BrokerConfig()
    loaded = config.load(str(path), {}, usable=lambda: small)
    assert loaded == config.load(None, {}, usable=lambda: small)
    assert loaded.wal.cache_total_bytes < config.BrokerConfig().wal.cache_total_bytes  # sized, not pinned


def test_every_setting_is_in_the_sample() -> None:
    given = tomllib.loads(sample())
    missing = []
    for section, defaults in SECTIONS.items():
        for f in dataclasses.fields(defaults):
            if dataclasses.is_dataclass(getattr(defaults, f.name)) or (section, f.name) in NOT_SETTINGS:
                continue
            if f.name not in given.get(section, {}):
                missing.append(f"[{section}] {f.name}")
    assert missing == []
    assert set(given) == set(SECTIONS)
