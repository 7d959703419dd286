"""`danube-fast broker` sizes its memory defaults from the memory it may use on this machine (cgroup limits,
physical memory: danube_fast/broker/memory.py) and says so in one line at start; a value its config file
sets is kept and named as such."""

from __future__ import annotations

from danube_fast.broker.config import BrokerConfig
from danube_fast.broker.memory import SHARES, size, usable_memory
from danube_fast.testing.broker import READY_LINE, BrokerFactory


def test_the_broker_logs_the_memory_it_sized_from_and_keeps_what_its_file_sets(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory.start("[dispatch]\nbroker_bytes = 100663296\n")
    usable = usable_memory()
    assert usable is not None
    share = {s.name: s for s in SHARES}
    cache = share["cache_total_bytes"].of(BrokerConfig().wal.cache_total_bytes, usable)
    keep = share["malloc_keep_bytes"].of(BrokerConfig().malloc_keep_bytes, usable)
    commit = share["commit_bytes"].of(BrokerConfig().tables.commit_bytes, usable)
    native = share["fast_inflight_bytes"].of(BrokerConfig().fast_inflight_bytes, usable)
    lines = [line.split(": ", 1)[1] for line in broker.log_text().splitlines() if "INFO" in line and
             ": memory: " in line]
    assert lines == [f"memory: {size(usable.nbytes)} usable ({usable.source}); sized from it: "
                     f"[wal] cache_total_bytes = {size(cache)}, [broker] malloc_keep_bytes = {size(keep)}, "
                     f"[tables] commit_bytes = {size(commit)}, "
                     f"[broker] fast_inflight_bytes = {size(native)}; "
                     f"as configured: [dispatch] broker_bytes = 96 MiB"], broker.log_tail()
    assert READY_LINE in broker.log_text()
