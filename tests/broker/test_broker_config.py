"""Broker settings: defaults, TOML overrides per section, flags last, and errors that name the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from danube_fast.broker.config import BrokerConfig, ConfigError, DispatchConfig, load
from danube_fast.broker.memory import UsableMemory
from danube_fast.meta.resources import Policy
from danube_fast.storage.config import SyncPolicy, WalConfig


def plenty() -> UsableMemory:
    """Memory enough for every memory default to stay as the dataclasses say (the sizing:
    tests/unit/test_memory_defaults.py)."""
    return UsableMemory(64 << 30, "physical memory")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_defaults_without_a_file() -> None:
    config = load(None, {}, usable=plenty)
    assert config == BrokerConfig()
    assert config.mode == "standalone"
    assert config.broker_addr == "127.0.0.1:6650"
    assert config.admin_addr == "127.0.0.1:50051"
    assert config.prom_exporter == "127.0.0.1:9040"
    assert config.max_message_size == 10 * 1024 * 1024
    assert config.malloc_keep_bytes == 256 * 1024 * 1024
    assert config.wal == WalConfig()
    assert config.wal.sync == SyncPolicy("always")
    assert config.dispatch == DispatchConfig(window=1000, ack_timeout_ms=30_000, nack_base_delay_ms=1000,
                                             nack_max_delay_ms=60_000, max_redeliveries=5,
                                             cursor_flush_acks=1000, cursor_flush_ms=5000, buffer=1000)
    assert config.policy == Policy()
    assert config.advertised_url == "http://127.0.0.1:6650"
    assert config.metadata_path == "./danube-data/metadata.db"
    assert config.wal_root == "./danube-data/wal"
    assert config.native_addr == "127.0.0.1:6653"  # on in standalone mode


def test_the_native_transport_is_on_in_standalone_off_in_a_cluster_unless_set() -> None:
    assert load(None, {"broker_addr": "10.0.0.5:7000"}, usable=plenty).native_addr == "10.0.0.5:6653"
    assert load(None, {"fast_addr": ""}, usable=plenty).native_addr == ""
    cluster = {"mode": "cluster", "cluster.metadata_store": "etcd://127.0.0.1:2379",
               "cluster.object_store": "/tmp/objects"}
    assert load(None, cluster, usable=plenty).native_addr == ""
    assert load(None, {**cluster, "fast_addr": "0.0.0.0:6653"}, usable=plenty).native_addr == "0.0.0.0:6653"


def test_the_console_is_on_at_loopback_in_standalone_off_in_a_cluster_unless_set() -> None:
    # Loopback whatever broker_addr is: a console exposed beyond the machine is an operator's choice.
    assert load(None, {"broker_addr": "10.0.0.5:7000"}, usable=plenty).console_listen == "127.0.0.1:9080"
    assert load(None, {"console_addr": ""}, usable=plenty).console_listen == ""
    cluster = {"mode": "cluster", "cluster.metadata_store": "etcd://127.0.0.1:2379",
               "cluster.object_store": "/tmp/objects"}
    assert load(None, cluster, usable=plenty).console_listen == ""
    set_here = load(None, {**cluster, "console_addr": "0.0.0.0:9080"}, usable=plenty)
    assert set_here.console_listen == "0.0.0.0:9080"
    with pytest.raises(ConfigError, match="console_addr"):
        load(None, {"console_addr": "no-port"}, usable=plenty)


def test_each_section_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = write(tmp_path, """
[broker]
data_dir = "/var/lib/danube"
broker_addr = "0.0.0.0:7650"
advertised_addr = "broker-1.example:7650"

[wal]
sync = "interval(250)"
segment_bytes = 1048576

[dispatch]
window = 16
nack_base_delay_ms = 200
max_redeliveries = 3

[policy]
max_consumers_per_topic = 10
""")
    config = load(path, {}, usable=plenty)
    assert config.data_dir == "/var/lib/danube"
    assert config.broker_addr == "0.0.0.0:7650"
    assert config.admin_addr == "127.0.0.1:50051"  # untouched
    assert config.advertised_url == "http://broker-1.example:7650"
    assert config.wal_root == "/var/lib/danube/wal"
    assert config.wal == WalConfig(sync=SyncPolicy("interval", 250), segment_bytes=1048576)
    assert config.dispatch == DispatchConfig(window=16, nack_base_delay_ms=200, max_redeliveries=3)
    assert config.policy == Policy(max_consumers_per_topic=10)


@pytest.mark.parametrize(("text", "sync"), [
    ('sync = "none"', SyncPolicy("none")),
    ('sync = "always"', SyncPolicy("always")),
    ('sync = "interval(5ms)"', SyncPolicy("interval", 5)),
])
def test_sync_policies(tmp_path: Path, text: str, sync: SyncPolicy) -> None:
    assert load(write(tmp_path, f"[wal]\n{text}\n"), {}).wal.sync == sync


def test_a_bool_setting_reads_from_the_file(tmp_path: Path) -> None:
    assert BrokerConfig().wal.direct_io is True
    assert load(write(tmp_path, "[wal]\ndirect_io = false\n"), {}).wal.direct_io is False


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nbroker_addr = "127.0.0.1:7000"\ndata_dir = "/d"\n')
    config = load(path, {"broker_addr": "127.0.0.1:8000", "data_dir": None})  # None: flag not given
    assert config.broker_addr == "127.0.0.1:8000"
    assert config.data_dir == "/d"


@pytest.mark.parametrize(("text", "names"), [
    ('[broker]\nbroker_adr = "127.0.0.1:1"\n', ["[broker]", "broker_adr"]),
    ("[dispatch]\nwindows = 3\n", ["[dispatch]", "windows"]),
    ("[wal]\nsegment_size = 3\n", ["[wal]", "segment_size"]),
    ("[policy]\nmax_topics = 3\n", ["[policy]", "max_topics"]),
    ("[policy]\nextra = 3\n", ["[policy]", "extra"]),  # the resource's internal field is no setting
    ("[brokers]\nmode = \"standalone\"\n", ["brokers"]),
    ("[clusters]\n", ["clusters"]),
    ("[cluster]\nleader = 1\n", ["[cluster]", "leader"]),
])
def test_unknown_settings_and_sections_are_named(tmp_path: Path, text: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), {})
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(("text", "names"), [
    ('[dispatch]\nwindow = "16"\n', ["[dispatch]", "window"]),
    ("[dispatch]\nwindow = 1.5\n", ["[dispatch]", "window"]),
    ("[dispatch]\nack_timeout_ms = true\n", ["[dispatch]", "ack_timeout_ms"]),  # a bool is no int here
    ("[dispatch]\nbuffer = -1\n", ["[dispatch]", "buffer"]),
    ("[broker]\nbroker_addr = 6650\n", ["[broker]", "broker_addr"]),
    ("[broker]\nmax_message_size = \"10MB\"\n", ["[broker]", "max_message_size"]),
    ("[wal]\nsegment_bytes = [1]\n", ["[wal]", "segment_bytes"]),
    ("[wal]\ndirect_io = 1\n", ["[wal]", "direct_io", "bool"]),  # an int is no bool either
    ('[wal]\ndirect_io = "yes"\n', ["[wal]", "direct_io", "bool"]),
    ("[policy]\nmax_message_size = -5\n", ["[policy]", "max_message_size"]),
])
def test_wrong_types_are_refused_naming_the_setting(tmp_path: Path, text: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), {})
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("section", ["broker", "wal", "dispatch", "policy"])
def test_a_section_that_is_not_a_table_is_a_config_error(tmp_path: Path, section: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, f"{section} = 3\n"), {})
    assert section in str(info.value)


@pytest.mark.parametrize("sync", ['"sometimes"', '"interval(0)"', '"interval(-5)"', '"interval"', "5"])
def test_bad_sync_policy(tmp_path: Path, sync: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, f"[wal]\nsync = {sync}\n"), {})
    assert "[wal]" in str(info.value)
    assert "sync" in str(info.value)


@pytest.mark.parametrize(("text", "name"), [
    ('[broker]\nmode = "fleet"\n', "mode"),
    ('[broker]\nmode = "cluster"\n', "metadata_store"),
    ('[broker]\nmode = "cluster"\n[cluster]\nmetadata_store = "embedded:/x.db"\n', "etcd://"),
    ('[cluster]\nlease_ttl_s = 1\n', "lease_ttl_s"),
    ('[broker]\nbroker_addr = "localhost"\n', "broker_addr"),
    ('[broker]\nadmin_addr = "host:99999"\n', "admin_addr"),
    ('[broker]\nprom_exporter = ":9040"\n', "prom_exporter"),
    ('[broker]\nfast_advertised_addr = "broker-1"\n', "fast_advertised_addr"),
    ("[dispatch]\nmax_delivery_delay_ms = 0\n", "max_delivery_delay_ms"),
    ("[dispatch]\ndelayed_index_records = 0\n", "delayed_index_records"),
    ("[dispatch]\nwindow = 0\n", "window"),
    ("[broker]\nmax_message_size = 0\n", "max_message_size"),
    ("[broker]\nmalloc_keep_bytes = -1\n", "malloc_keep_bytes"),
    ("[broker]\nstall_dump_ms = 50\n", "stall_dump_ms"),
    ("[broker]\nstall_dump_ms = -1\n", "stall_dump_ms"),
    ("[broker]\nmalloc_keep_bytes = 2147483648\n", "malloc_keep_bytes"),
    ("[wal]\nsegment_bytes = 2147483648\n", "segment_bytes"),  # the WAL refused it per topic (INTERNAL)
    ("[wal]\nsegment_bytes = 0\n", "segment_bytes"),
    ("[wal]\nidle_release_ms = -1\n", "idle_release_ms"),
    ("[wal]\nmax_group_bytes = 0\n", "max_group_bytes"),
])
def test_invalid_values_are_refused(tmp_path: Path, text: str, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load(write(tmp_path, text), {})


def test_prometheus_endpoint_may_be_disabled(tmp_path: Path) -> None:
    assert load(write(tmp_path, '[broker]\nprom_exporter = ""\n'), {}).prom_exporter == ""


def test_unreadable_or_malformed_files(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load(missing, {})
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load(write(tmp_path, "[dispatch\nwindow = 3\n"), {})
    assert info.value.__cause__ is not None  # the TOML error is chained, not flattened


def test_cluster_settings_from_file_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nmode = "cluster"\n[cluster]\nmetadata_store = "etcd://10.0.0.1:2379"\n'
                           'name = "east"\nlease_ttl_s = 4\nobject_store = "s3://bucket/prefix"\n')
    config = load(path, {"cluster.metadata_store": "etcd://127.0.0.1:2379", "cluster.name": None})
    assert config.clustered
    assert config.cluster.metadata_store == "etcd://127.0.0.1:2379"  # the flag wins
    assert config.cluster.name == "east"  # not given as a flag: the file's
    assert config.cluster.lease_ttl_s == 4
    assert config.object_store == "s3://bucket/prefix"
    assert load(None, {}).object_store == os.path.join("./danube-data", "objects")
