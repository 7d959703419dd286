"""Metadata backup and restore (danube_fast.meta.backup) and its command line, against a real etcd and the
embedded store: lossless round trips, refusals that write nothing, leased keys, exit codes."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from danube_fast.meta import keys
from danube_fast.meta.backup import (
    BackupFileError,
    RestoreIncomplete,
    StoreNotEmpty,
    backup,
    decode,
    encode,
    restore,
)
from danube_fast.meta.embedded import EmbeddedStore
from danube_fast.meta.etcd import EtcdStore
from danube_fast.meta.store import (
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compare,
    KeyValue,
    MetadataStore,
    Op,
    Put,
    TxnResult,
)
from danube_fast.testing.etcd import EtcdServer
from danube_fast.testing.plugin import StoreFactory
from danube_fast.testing.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TEST_SECONDS = 30
CLI_SECONDS = 60
BIG_VALUE = 600 * 1024  # three of them exceed one transaction's byte limit: restore must split them


def sample() -> dict[str, bytes]:
    """Keys at many depths, binary and empty values, non-ASCII keys, more keys than one transaction holds,
    and values too big to share a transaction."""
    data: dict[str, bytes] = {
        keys.leader(): b"7",
        keys.broker_register(7): json.dumps({"broker_addr": "http://127.0.0.1:6650"}).encode(),
        "/bin/all-bytes": bytes(range(256)),
        "/bin/empty": b"",
        "/bin/nul-and-newlines": b"\0\n\r\n\0{\"",
        "/unicode/é-ü/名前": "值 ✓".encode(),
        "/spaces/a b/c d": b"x",
    }
    for depth in range(1, 16):
        data["/deep/" + "/".join(f"d{i}" for i in range(depth))] = os.urandom(depth * 7)
    for i in range(2 * MAX_TXN_OPS + 40):
        data[f"/many/{i:04d}"] = os.urandom(i % 97)
    for name in "abc":
        data[f"/big/{name}"] = os.urandom(BIG_VALUE)
    return data


async def fill(s: MetadataStore, data: dict[str, bytes]) -> None:
    items = sorted(data.items())
    for start in range(0, len(items), 64):
        chunk = items[start:start + 64]
        if any(len(v) > 4096 for _, v in chunk):
            for k, v in chunk:
                await s.put(k, v)
        else:
            await s.transaction((), [Put(k, v) for k, v in chunk])


async def contents(s: MetadataStore) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in await s.get_prefix("/")}


async def fresh_etcd(server: EtcdServer) -> EtcdStore:
    s = await EtcdStore.connect([server.endpoint])
    await s.delete_prefix("/")
    return s


def backup_bytes(entries: Sequence[tuple[str, bytes, int]], revision: int = 42) -> bytes:
    return encode([KeyValue(k, v, 1, 1, 1, lease) for k, v, lease in entries], revision,
                  "2025-01-01T00:00:00+00:00")


# ------------------------------------------------------------------------------------------- round trip


def test_round_trip_embedded_etcd_embedded_is_lossless(run: Callable[..., Any], etcd: EtcdServer,
                                                       tmp_path: Path) -> None:
    data = sample()
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"

    async def check() -> None:
        source = await EmbeddedStore.open(tmp_path / "source.db")
        try:
            await fill(source, data)
            made = await backup(source, first)
            assert (made.key_count, made.revision) == (len(data), await source.current_revision())
        finally:
            await source.close()

        middle = await fresh_etcd(etcd)
        try:
            restored = await restore(middle, first)
            assert restored.keys_written == len(data) and restored.skipped_ephemeral == ()
            assert restored.transactions > -(-len(data) // MAX_TXN_OPS)  # the big values forced extra ones
            assert await contents(middle) == data
            assert all(kv.version == 1 for kv in await middle.get_prefix("/"))
            await backup(middle, second)
        finally:
            await middle.close()

        target = await EmbeddedStore.open(tmp_path / "target.db")
        try:
            assert (await restore(target, second)).keys_written == len(data)
            assert await contents(target) == data
        finally:
            await target.close()

    run(check(), timeout=TEST_SECONDS)
    # Same keys and values, so the same entry lines: only the header's revision and date may differ.
    one, two = first.read_bytes(), second.read_bytes()
    assert one.partition(b"\n")[2] == two.partition(b"\n")[2]
    assert decode(one).entries == decode(two).entries
    assert oct(first.stat().st_mode & 0o777) == "0o600"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_backup_replaces_the_file_and_restores_an_empty_store(run: Callable[..., Any], store: StoreFactory,
                                                             tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(b"an older file")

    async def check() -> None:
        async with store() as s:
            made = await backup(s, path)
            assert made.key_count == 0
            header = json.loads(path.read_bytes())
            assert header["format"] == "danube-fast-metadata" and header["version"] == 1
            assert header["key_count"] == 0 and header["revision"] == made.revision
            assert (await restore(s, path)).keys_written == 0

    run(check(), timeout=TEST_SECONDS)


# ----------------------------------------------------------------------------------- refusals write nothing


def test_restore_refuses_a_non_empty_store(run: Callable[..., Any], store: StoreFactory,
                                           tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(backup_bytes([("/x", b"from the file", 0)]))

    async def check() -> None:
        async with store() as s:
            await s.put("/a", b"1")
            await s.put("/x", b"mine")
            before, revision = await contents(s), await s.current_revision()
            with pytest.raises(StoreNotEmpty, match=r"already holds 2 key\(s\)") as caught:
                await restore(s, path)
            assert caught.value.key_count == 2
            assert await contents(s) == before and await s.current_revision() == revision

    run(check(), timeout=TEST_SECONDS)


GOOD = backup_bytes([("/a", b"1", 0), ("/b/c", b"\xff\x00", 0), ("/d", b"3", 0x1F)])
GOOD_HEADER, _, GOOD_BODY = GOOD.partition(b"\n")


def _header(**changes: object) -> bytes:
    header = json.loads(GOOD_HEADER)
    header.update(changes)
    return json.dumps(header).encode() + b"\n" + GOOD_BODY


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _reencoded(lines: list[object]) -> bytes:
    """Entry lines as given, under a header whose count and checksum match them."""
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return _header(key_count=len(lines), entries_sha256=hashlib.sha256(body).hexdigest()).partition(
        b"\n")[0] + b"\n" + body


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "no complete header line"),
    "header cut short": (GOOD_HEADER[:20], "no complete header line"),
    "cut mid-line": (GOOD[:-5], "line 4 is cut short"),
    "cut at a line end": (GOOD[:GOOD.rindex(b"\n", 0, -1) + 1], "announces 3 key.* holds 2"),
    "one line too many": (GOOD + GOOD_BODY.partition(b"\n")[0] + b"\n", "announces 3 key.* holds 4"),
    "flipped bit in a value": (_flip(GOOD, len(GOOD) - 30), "corrupt"),
    "not JSON": (b"PK\x03\x04 a zip file\n", "line 1 is not valid JSON"),
    "another format": (_header(format="etcdctl-snapshot"), "not a danube-fast metadata backup"),
    "a later version": (_header(version=2), "version 2 is not supported"),
    "count not a number": (_header(key_count="3"), "key_count"),
    "unknown header field": (_header(compressed=True), "unknown field"),
    "no checksum": (_header(entries_sha256=None), "entries_sha256"),
    "bad base64": (_reencoded([{"key": "/a", "value_b64": "not base64!"}]), "line 2: value_b64 .* base64"),
    "key not a path": (_reencoded([{"key": "a", "value_b64": ""}]), "line 2: .*paths starting with '/'"),
    "keys out of order": (_reencoded([{"key": "/b", "value_b64": ""}, {"key": "/a", "value_b64": ""}]),
                          "line 3: key '/a' is not after '/b'"),
    "duplicate key": (_reencoded([{"key": "/a", "value_b64": ""}, {"key": "/a", "value_b64": ""}]),
                      "line 3: key '/a' is not after"),
    "zero lease": (_reencoded([{"key": "/a", "value_b64": "", "lease": "0"}]), "line 2: lease '0'"),
    "value too large": (backup_bytes([("/a", b"v" * (MAX_VALUE_BYTES + 1), 0)]), "line 2: .*over the limit"),
    "entry not an object": (_reencoded([["/a", ""]]), "line 2 is not a JSON object"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_restore_refuses_a_bad_file_and_writes_nothing(run: Callable[..., Any], store: StoreFactory,
                                                       tmp_path: Path, name: str) -> None:
    data, message = BAD_FILES[name]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)

    async def check() -> None:
        async with store() as s:
            revision = await s.current_revision()
            with pytest.raises(BackupFileError, match=message):
                await restore(s, path)
            assert await s.get_prefix("/") == [] and await s.current_revision() == revision

    run(check(), timeout=TEST_SECONDS)


def test_the_good_file_of_the_refusal_cases_restores(run: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "good.jsonl"
    path.write_bytes(GOOD)

    async def check() -> None:
        s = await EmbeddedStore.open(tmp_path / "meta.db")
        try:
            done = await restore(s, path)
            assert (done.keys_written, done.skipped_ephemeral, done.source_revision) == (2, ("/d",), 42)
            assert await contents(s) == {"/a": b"1", "/b/c": b"\xff\x00"}
        finally:
            await s.close()

    run(check(), timeout=TEST_SECONDS)


class _Interloper:
    """A store on which another client creates a key of the restore between its first two transactions."""

    def __init__(self, inner: MetadataStore, key: str) -> None:
        self.inner, self.key, self.calls = inner, key, 0

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op],
                          failure: Sequence[Op] = ()) -> TxnResult:
        self.calls += 1
        if self.calls == 2:
            await self.inner.put(self.key, b"someone else's")
        return await self.inner.transaction(compare, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_restore_never_overwrites_a_key_created_meanwhile(run: Callable[..., Any], tmp_path: Path) -> None:
    entries = [(f"/k/{i:04d}", b"restored", 0) for i in range(MAX_TXN_OPS + 10)]
    path = tmp_path / "b.jsonl"
    path.write_bytes(backup_bytes(entries))
    late_key = entries[MAX_TXN_OPS + 5][0]

    async def check() -> None:
        inner = await EmbeddedStore.open(tmp_path / "meta.db")
        try:
            with pytest.raises(RestoreIncomplete, match="another client created one of the keys") as caught:
                await restore(_Interloper(inner, late_key), path)  # type: ignore[arg-type]
            assert (caught.value.written, caught.value.total) == (MAX_TXN_OPS, len(entries))
            kv = await inner.get(late_key)
            assert kv is not None and kv.value == b"someone else's"
            assert len(await inner.get_prefix("/")) == MAX_TXN_OPS + 1
        finally:
            await inner.close()

    run(check(), timeout=TEST_SECONDS)


# -------------------------------------------------------------------------------------------- leased keys


def test_leased_keys_are_recorded_then_skipped_or_restored_without_lease(
        run: Callable[..., Any], store: StoreFactory, tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    ephemeral = {keys.leader(): b"3", keys.broker_register(3): b"{}"}

    async def check() -> None:
        async with store() as s:
            lease = await s.grant_lease(60)
            for k, v in ephemeral.items():
                await s.put(k, v, lease=lease)
            await s.put("/durable", b"d")
            assert (await backup(s, path)).leased_keys == 2
            await s.revoke_lease(lease)
        lines = [json.loads(line) for line in path.read_bytes().splitlines()[1:]]
        assert {line["key"]: int(line["lease"], 16) for line in lines if "lease" in line} == {
            k: lease for k in ephemeral}

        skipping = await EmbeddedStore.open(tmp_path / "skip.db")
        keeping = await EmbeddedStore.open(tmp_path / "keep.db")
        try:
            skipped = await restore(skipping, path)
            assert skipped.skipped_ephemeral == tuple(sorted(ephemeral)) and skipped.unleased_ephemeral == ()
            assert await contents(skipping) == {"/durable": b"d"}
            kept = await restore(keeping, path, skip_ephemeral=False)
            assert kept.unleased_ephemeral == tuple(sorted(ephemeral)) and kept.skipped_ephemeral == ()
            assert await contents(keeping) == {**ephemeral, "/durable": b"d"}
            assert all(kv.lease == 0 for kv in await keeping.get_prefix("/"))
        finally:
            await skipping.close()
            await keeping.close()

    run(check(), timeout=TEST_SECONDS)


# ---------------------------------------------------------------------------------- the command line


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "danube_fast.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=CLI_SECONDS, check=False)


def sync(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_cli_backup_and_restore_end_to_end(etcd: EtcdServer, tmp_path: Path) -> None:
    data = {k: v for k, v in sample().items() if not k.startswith("/big/")}
    ephemeral = keys.broker_register(7)

    async def seed() -> None:
        s = await EmbeddedStore.open(tmp_path / "source.db")
        try:
            await fill(s, {k: v for k, v in data.items() if k != ephemeral})
            await s.put(ephemeral, data[ephemeral], lease=await s.grant_lease(600))
        finally:
            await s.close()

    async def read(url_path: Path | None) -> dict[str, bytes]:
        s: MetadataStore = (await EmbeddedStore.open(url_path) if url_path
                            else await EtcdStore.connect([etcd.endpoint]))
        try:
            return await contents(s)
        finally:
            await s.close()

    sync(seed())
    sync(_clear(etcd))
    etcd_url = f"etcd://{etcd.endpoint}"

    done = cli("admin", "metadata", "backup", "first.jsonl", "--store", "embedded:source.db", "--output",
               "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["key_count"] == len(data) and summary["leased_keys"] == 1
    assert summary["path"] == "first.jsonl"

    done = cli("admin", "metadata", "restore", "first.jsonl", "--store", etcd_url, "--output", "json",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["keys_written"] == len(data) - 1 and summary["skipped_ephemeral"] == [ephemeral]
    durable = {k: v for k, v in data.items() if k != ephemeral}
    assert sync(read(None)) == durable

    done = cli("admin", "metadata", "backup", str(tmp_path / "second.jsonl"), "--store", etcd_url,
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert table["key_count"] == str(len(durable)) and table["leased_keys"] == "0"

    done = cli("admin", "metadata", "restore", "second.jsonl", "--store", "embedded:target.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert table["keys_written"] == str(len(durable)) and table["skipped_ephemeral"] == "0"
    assert sync(read(tmp_path / "target.db")) == durable

    # Into a store that is not empty: refused, one line, nothing written.
    done = cli("admin", "metadata", "restore", "first.jsonl", "--store", etcd_url, "--no-skip-ephemeral",
               cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"metadata restore failed: the target store already holds {len(durable)} key(s)" in done.stderr
    assert sync(read(None)) == durable

    # A truncated file: refused before the store is touched.
    (tmp_path / "cut.jsonl").write_bytes((tmp_path / "first.jsonl").read_bytes()[:-3])
    done = cli("admin", "metadata", "restore", "cut.jsonl", "--store", "embedded:fresh.db", cwd=tmp_path)
    assert done.returncode == 1 and "is cut short: the file is truncated" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "fresh.db").exists()


async def _clear(server: EtcdServer) -> None:
    s = await fresh_etcd(server)
    await s.close()


@pytest.mark.parametrize(("store_url", "code", "message"), [
    ("bogus", 2, "'bogus' is not a metadata store URL: write embedded:/path/to/meta.db or etcd://"),
    ("embedded:", 2, "names no file"),
    ("etcd://", 2, "names no etcd endpoint"),
    ("etcd://localhost", 2, "etcd endpoint 'localhost' in 'etcd://localhost' is not host:port"),
    ("etcd://127.0.0.1:2379,h:99999", 2, "port '99999' is not a number in 1..65535"),
    ("etcd://::1:2379", 2, "IPv6 host in brackets"),
    ("embedded:missing.db", 1, "metadata backup failed: there is no embedded metadata store at missing.db"),
    ("etcd://127.0.0.1:{free}", 1, "metadata backup failed: etcd is unreachable at 127.0.0.1:"),
])
def test_cli_refuses_a_bad_or_unreachable_store(tmp_path: Path, store_url: str, code: int,
                                                message: str) -> None:
    done = cli("admin", "metadata", "backup", "out.jsonl", "--store", store_url.format(free=free_port()),
               "--timeout", "1", cwd=tmp_path)
    assert done.returncode == code and done.stdout == ""
    assert message in done.stderr and "Traceback" not in done.stderr
    if code == 1:
        assert done.stderr.count("\n") == 1
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "missing.db").exists()


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in [(), ("admin",), ("admin", "metadata"), ("admin", "metadata", "backup", "f"),
                 ("admin", "metadata", "backup", "f", "--store", "embedded:x.db", "--output", "xml")]:
        done = cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and "usage: danube-fast" in done.stderr, (args, done.stderr)


def test_value_b64_is_standard_base64() -> None:
    line = backup_bytes([("/a", b"\xfb\xff", 0)]).splitlines()[1]
    assert json.loads(line) == {"key": "/a", "value_b64": base64.b64encode(b"\xfb\xff").decode()}
