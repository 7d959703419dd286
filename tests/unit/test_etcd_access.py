"""The etcd TLS and user settings without an etcd: the store URL's https:// endpoints, EtcdAccess's checks
and where the password comes from, and the broker's [cluster] etcd_* settings. tests/cluster/test_etcd_tls.py
runs them against a real etcd."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube_fast.broker import config
from danube_fast.meta.connect import StoreUrl, StoreUrlError, check_access, parse_store_url
from danube_fast.meta.etcd_access import ETCD_PASSWORD_ENV, EtcdAccess, EtcdAccessError


def test_an_https_endpoint_means_tls() -> None:
    url = parse_store_url("etcd://https://10.0.0.1:2379,https://[::1]:2380")
    assert url == StoreUrl("etcd", endpoints=("https://10.0.0.1:2379", "https://[::1]:2380"))
    assert url.tls and str(url) == "etcd://https://10.0.0.1:2379,https://[::1]:2380"
    assert not parse_store_url("etcd://10.0.0.1:2379").tls


@pytest.mark.parametrize(("url", "error"), [
    ("etcd://https://a:1,b:2", "mixes https:// and plaintext etcd endpoints"),
    ("etcd://http://a:1", "is not host:port or https://host:port"),
    ("etcd://https://a", "is not host:port"),
])
def test_store_urls_that_cannot_be_meant(url: str, error: str) -> None:
    with pytest.raises(StoreUrlError, match=error):
        parse_store_url(url)


def test_etcd_settings_are_refused_for_an_embedded_store() -> None:
    with pytest.raises(StoreUrlError, match="is an embedded store"):
        check_access(parse_store_url("embedded:/tmp/meta.db"), EtcdAccess(user="root"))
    check_access(parse_store_url("embedded:/tmp/meta.db"), EtcdAccess())  # the variable's name is no setting


@pytest.mark.parametrize(("access", "error"), [
    (EtcdAccess(cert_file="c.pem"), "--cert and --key go together"),
    (EtcdAccess(key_file="k.pem"), "--cert and --key go together"),
    (EtcdAccess(user="root", password="p", password_file="f"), "give password or --password-file, not both"),
    (EtcdAccess(password="p"), "an etcd password needs --user"),
])
def test_settings_that_cannot_work_are_named_in_the_callers_words(access: EtcdAccess, error: str) -> None:
    with pytest.raises(EtcdAccessError, match=error):
        access.check({"cert_file": "--cert", "key_file": "--key", "user": "--user",
                      "password_file": "--password-file"})


def test_the_password_comes_from_the_setting_then_the_file_then_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "password"
    file.write_text("from-file\n")
    env = {ETCD_PASSWORD_ENV: "from-env", "OTHER": "other"}
    assert EtcdAccess(user="u", password="given").resolve_password(env) == "given"
    assert EtcdAccess(user="u", password_file=str(file)).resolve_password(env) == "from-file"
    assert EtcdAccess(user="u").resolve_password(env) == "from-env"
    assert EtcdAccess(user="u", password_env="OTHER").resolve_password(env) == "other"
    assert EtcdAccess().resolve_password(env) == ""  # no user, no login
    with pytest.raises(EtcdAccessError, match=f"has no password: give password_file, or the environment "
                                              f"variable {ETCD_PASSWORD_ENV}"):
        EtcdAccess(user="u").resolve_password({})
    with pytest.raises(EtcdAccessError, match="cannot read the etcd password file"):
        EtcdAccess(user="u", password_file=str(tmp_path / "missing")).resolve_password(env)
    assert "given" not in repr(EtcdAccess(user="u", password="given"))


def test_the_broker_reads_its_etcd_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ETCD_PASSWORD_ENV, "from-env")
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\nmode = "cluster"\n[cluster]\nmetadata_store = "etcd://https://127.0.0.1:2379"\n'
                    'etcd_ca_file = "ca.pem"\netcd_cert_file = "c.pem"\netcd_key_file = "k.pem"\n'
                    'etcd_user = "root"\n')
    loaded = config.load(str(path), {})
    assert loaded.cluster.etcd_access() == EtcdAccess("ca.pem", "c.pem", "k.pem", "root")
    assert loaded.cluster.etcd_password == ""  # the environment is read where the store opens

    path.write_text(path.read_text().replace('etcd_key_file = "k.pem"\n', ""))
    with pytest.raises(config.ConfigError, match=r"\[cluster\] etcd_cert_file and \[cluster\] etcd_key_file "
                                                 "go together"):
        config.load(str(path), {})
    monkeypatch.delenv(ETCD_PASSWORD_ENV)
    path.write_text(path.read_text().replace('etcd_cert_file = "c.pem"\n', ""))
    with pytest.raises(config.ConfigError, match=r"etcd user 'root' has no password: give \[cluster\] "
                                                 "etcd_password_file, or the environment variable"):
        config.load(str(path), {})
