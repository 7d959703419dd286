"""`danube-fast produce` and `danube-fast consume` as a user runs them, against a broker subprocess: from
arguments and stdin, repeated with --count, keys and attributes, read back by offset and through a
subscription (acknowledged), both output formats, and their usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from danube_fast.testing.broker import Broker

CLI = [sys.executable, "-m", "danube_fast.cli.main"]


def cli(broker: Broker, *args: str, stdin: bytes = b"", code: int = 0, timeout: float = 60
        ) -> tuple[bytes, str]:
    """Run a command against the broker's client port: (stdout, stderr)."""
    done = subprocess.run([*CLI, *args, "--addr", broker.target], input=stdin, capture_output=True,
                          timeout=timeout, check=False)
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout!r}\n{done.stderr.decode()}"
    return done.stdout, done.stderr.decode()


def produced(broker: Broker, *args: str, stdin: bytes = b"") -> Any:
    out, _ = cli(broker, "produce", *args, "--output", "json", stdin=stdin)
    return json.loads(out)


def subscribed(broker: Broker, topic: str, subscription: str) -> float:
    """Consumers of the subscription with an active stream, as the metrics endpoint says (0: none yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "danube_subscription_consumers" and sample.labels == {
                    "topic": topic, "subscription": subscription}:
                return sample.value
    return 0


def test_produce_arguments_then_read_them_back_by_offset(broker: Broker, topic: str) -> None:
    summary = produced(broker, topic, "one", "--key", "k1", "two", "three", "--attr", "a=1", "--attr",
                       "b=x=y")
    assert summary | {"seconds": 0, "records_per_s": 0} == {
        "topic": topic, "records": 3, "bytes": 11, "first_offset": 0, "last_offset": 2, "seconds": 0,
        "records_per_s": 0}
    out, err = cli(broker, "consume", topic, "--from", "earliest", "--to-end")
    assert out == b"one\ntwo\nthree\n"
    assert "records  3" in err
    out, _ = cli(broker, "consume", topic, "--from", "1", "--count", "1", "--format", "json")
    row = json.loads(out)
    assert row["offset"] == 1 and row["payload"] == "two" and row["key"] == "k1"
    assert row["attributes"] == {"a": "1", "b": "x=y"} and row["publish_time"] > 1_700_000_000_000


def test_produce_stdin_lines_repeated_with_count(broker: Broker, topic: str) -> None:
    summary = produced(broker, topic, "--count", "2500", "--batch", "1000", stdin=b"a\r\nbb\n\nccc")
    assert (summary["records"], summary["first_offset"], summary["last_offset"]) == (2500, 0, 2499)
    assert summary["bytes"] == sum(len(["a", "bb", "", "ccc"][i % 4]) for i in range(2500))
    out, _ = cli(broker, "consume", topic, "--from", "earliest", "--to-end")
    assert out.split(b"\n")[:-1] == [[b"a", b"bb", b"", b"ccc"][i % 4] for i in range(2500)]


def test_consume_through_a_subscription_acknowledges_what_it_printed(broker: Broker, topic: str) -> None:
    """A new subscription starts at the topic's end: the consumer subscribes first (it waits), then the
    producer sends; a second run of the same subscription gets only what came after the first's acks."""
    produced(broker, topic, "before")  # consumers never create topics; a new subscription starts after it
    waiting = subprocess.Popen([*CLI, "consume", topic, "--subscription", "s", "--type", "shared", "--count",
                                "3", "--addr", broker.target], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while subscribed(broker, topic, "s") < 1:  # then the produce below comes after its start
            assert time.monotonic() < deadline and waiting.poll() is None, "the consumer did not subscribe"
            time.sleep(0.1)
        produced(broker, topic, "--reliable", "m0", "m1", "m2")
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert out == b"m0\nm1\nm2\n"
    finally:
        waiting.kill()
    produced(broker, topic, "m3")
    described = subprocess.run([*CLI, "admin", "topics", "describe", topic, "--admin-addr",
                                f"127.0.0.1:{broker.admin_port}", "--output", "json"], capture_output=True,
                               check=True, timeout=30)
    d = json.loads(described.stdout)
    assert (d["delivery"], d["messages_in"], d["committed_offset"]) == ("Reliable", 5, 5), d
    assert d["subscriptions"] == [{"subscription": "s", "consumers": 0, "lag": 1, "unacked": 0,
                                   "delivered": 3, "redelivered": 0}]
    out, _ = cli(broker, "consume", topic, "--subscription", "s", "--type", "shared", "--count", "1",
                 "--format", "json")
    assert json.loads(out)["payload"] == "m3"  # m0..m2 were acknowledged: not given again


def test_binary_payloads_are_base64_in_json(broker: Broker, topic: str) -> None:
    produced(broker, topic, stdin=b"\xff\xfe\n")
    out, _ = cli(broker, "consume", topic, "--from", "earliest", "--to-end", "--format", "json")
    assert json.loads(out) | {"publish_time": 0} == {"offset": 0, "publish_time": 0, "key": None,
                                                     "attributes": {}, "payload_base64": "//4="}


def test_usage_errors_say_what_was_wrong(broker: Broker, topic: str) -> None:
    _, err = cli(broker, "produce", topic, "x", "--attr", "novalue", code=1)
    assert "produce failed: --attr 'novalue': expected NAME=VALUE" in err
    _, err = cli(broker, "consume", topic, "--subscription", "s", "--to-end", code=1)
    assert "a subscription reads from its cursor" in err
    _, err = cli(broker, "consume", topic, "--from", "soon", code=1)
    assert "--from 'soon'" in err
    _, err = cli(broker, "produce", topic, "x", "--batch", "0", code=2)
    assert "must be 1 or more" in err
    _, err = cli(broker, "produce", "not-a-topic", "x", code=1)
    assert "produce failed" in err and "not-a-topic" in err
    _, err = cli(broker, "produce", topic, "--count", "5", code=1)
    assert "nothing to send" in err


def test_produce_holds_its_rate(broker: Broker, topic: str) -> None:
    summary = produced(broker, topic, "tick", "--count", "600", "--rate", "400")
    assert summary["records"] == 600
    assert 1.3 <= summary["seconds"] < 10, summary  # the last batch is due at 1.475 s


def test_a_closed_stdout_ends_consume_quietly_as_cat_does(broker: Broker, topic: str) -> None:
    """`consume ... | head -2`: the reader goes away after two lines; the command ends without a word, with
    the status of a process SIGPIPE ended (141), and without waiting for the rest. The records are 1 MB in
    all: far more than a pipe's buffer (64 KiB), so the reader's going away is seen, however late it reads."""
    line = "l" * 200
    cli(broker, "produce", topic, line, "--count", "5000")
    pipeline = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -2', "pipeline", *CLI, "consume", topic, "--from",
         "earliest", "--to-end", "--addr", broker.target], capture_output=True, timeout=60, check=False)
    assert pipeline.stdout == f"{line}\n{line}\n".encode()
    assert pipeline.stderr == b"", pipeline.stderr.decode()
    assert pipeline.returncode == 141


def test_a_new_subscription_starts_where_from_says_an_existing_one_at_its_cursor(broker: Broker,
                                                                                  topic: str) -> None:
    produced(broker, topic, "a", "b", "c", "d", "e")

    def offsets(*args: str) -> list[int]:
        out, _ = cli(broker, "consume", topic, *args, "--format", "json")
        return [json.loads(line)["offset"] for line in out.splitlines()]

    assert offsets("--subscription", "fresh", "--from", "earliest", "--count", "3") == [0, 1, 2]
    assert offsets("--subscription", "fresh", "--from", "earliest", "--count", "2") == [3, 4]  # its cursor
    assert offsets("--subscription", "third", "--from", "3", "--count", "2") == [3, 4]
    _, err = cli(broker, "consume", topic, "--subscription", "far", "--from", "99", code=1)
    assert "initial position 99 is outside what" in err and "(0..5)" in err
