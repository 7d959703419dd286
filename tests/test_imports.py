"""The layering of `danube_fast/`, checked on the source (docs/ARCHITECTURE.md draws it).

- No import cycles: every module can be understood, and tested, after the ones it imports.
- Layers (LAYERS, docs/ARCHITECTURE.md "Layers"): a module imports only its own layer and the ones below;
  every module is in a layer, so a new one must be placed.
- The standalone broker core does not know about the cluster: only `broker/cluster/` and the composition
  root (`broker/assemble.py`) import `danube_fast.broker.cluster`; the core defines the small protocols that
  cluster mode implements.

Imports under `if TYPE_CHECKING:` count too: a type-only cycle still ties two modules' designs together.

And one import that is run, not read: pyarrow stays out of the processes that do not decode to Arrow.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "danube_fast"
CLUSTER = "danube_fast.broker.cluster"
# Lowest first: a module's layer is that of the longest prefix naming it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("danube_fast", "danube_fast.errors", "danube_fast.names", "danube_fast.latency",
              "danube_fast.allocator")),
    ("native core", ("danube_fast.codec", "danube_fast.transport")),
    ("metadata, schemas, security", ("danube_fast.meta", "danube_fast.schema", "danube_fast.security")),
    ("storage, clients, tables", ("danube_fast.storage", "danube_fast.client", "danube_fast.tables",
                                  "danube_fast.access")),
    ("broker", ("danube_fast.broker", "danube_fast.console")),
    ("tools", ("danube_fast.cli", "danube_fast.testing")),
)
COMPOSITION_ROOTS = {"danube_fast.broker.assemble"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "proto" not in p.relative_to(PACKAGE).parts}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The danube_fast modules `name` imports: `from pkg import mod` names the module, `from mod import
    attr` the module, never the parent packages Python also initialises on the way."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_the_source() -> None:
    edges = graph()
    assert "danube_fast.broker.server" in edges
    assert "danube_fast.storage.log_manager" in edges["danube_fast.broker.topic_registry"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def layer(module: str) -> int | None:
    """The index in LAYERS of `module`'s layer (None: in none)."""
    best: tuple[int, int] | None = None
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or
                                                                          len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def test_every_module_is_in_a_layer() -> None:
    assert sorted(m for m in graph() if layer(m) is None) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{m} ({LAYERS[layer(m) or 0][0]}) imports {d} ({LAYERS[layer(d) or 0][0]})"
              for m, deps in sorted(graph().items()) for d in sorted(deps)
              if (layer(d) or 0) > (layer(m) or 0)]
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert layer("danube_fast.security.rbac") == 2 and layer("danube_fast.broker.topics") == 4
    assert layer("danube_fast.names") == 0 and layer("danube_fast") == 0
    assert layer("danube_fast.codec.frames") == 1 and layer("danube_fast.storage.wal_engine") == 3


def test_the_cli_is_a_client_but_for_the_command_that_starts_a_broker() -> None:
    offenders = {name: sorted(d for d in deps if d.startswith("danube_fast.broker"))
                 for name, deps in graph().items()
                 if name.startswith("danube_fast.cli") and name != "danube_fast.cli.broker"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_spark_source_uses_only_the_access_modules() -> None:
    """spark/pyspark_danube reaches danube_fast through danube_fast/access (at most four modules), never
    its internals, so those can move without breaking the Spark source."""
    known = set(modules())
    used: dict[str, set[str]] = {}
    for path in (ROOT / "spark" / "pyspark_danube").glob("*.py"):
        for module in imported(f"pyspark_danube.{path.stem}", path, known):
            used.setdefault(module, set()).add(path.name)
    assert {m for m in used if not m.startswith("danube_fast.access.")} == set(), used
    assert 0 < len(used) <= 4


def test_only_the_cluster_and_the_composition_root_import_the_cluster() -> None:
    edges = graph()
    offenders = {
        name: sorted(m for m in deps if m == CLUSTER or m.startswith(CLUSTER + "."))
        for name, deps in edges.items()
        if name.startswith("danube_fast.broker")
        and not (name == CLUSTER or name.startswith(CLUSTER + "."))
        and name not in COMPOSITION_ROOTS
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("pure", ["0", "1"])
def test_pyarrow_is_imported_only_to_decode_to_arrow(pure: str) -> None:
    """The CLI, the clients and the broker do not import pyarrow (it cost every `danube-fast` call and every
    broker start about 65 ms); ARROW_SCHEMA and decode_arrow import it on first use, with either codec."""
    probe = (
        "import sys\n"
        "import danube_fast.cli.main, danube_fast.client, danube_fast.broker.server\n"
        "import danube_fast.codec.frames as f\n"
        "assert 'pyarrow' not in sys.modules, 'imported at start'\n"
        "batch = f.encode_payloads([b'x'])\n"
        "assert 'pyarrow' not in sys.modules, 'imported by encoding'\n"
        "assert f.decode_arrow(batch).schema == f.ARROW_SCHEMA and 'pyarrow' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "DANUBE_FAST_PURE": pure},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_broker_unpickles_the_table_workers_replies_without_importing_arrow_or_iceberg() -> None:
    """The broker decodes the worker's replies on its event loop: a type in them whose module imports
    pyarrow or pyiceberg would stall every producer for that import (70 ms, seen as an ack spike)."""
    probe = (
        "import sys\n"
        "import danube_fast.tables.worker_messages as m\n"
        "from danube_fast.tables.maintenance import Done\n"
        "c = m.Committed({'/default/t': 3}, 'loc', 1, 2)\n"
        "sent = m.encode((m.REPLY, 1, True, (c, Done(0, 0, 0, 0))))\n"
        "heavy = ('danube_fast.tables', 'pyarrow', 'pyiceberg')\n"
        "for name in [n for n in sys.modules if n.startswith(heavy)]:\n"
        "    del sys.modules[name]\n"
        "import danube_fast.tables.worker_messages as m\n"
        "got = m.decode(sent[m.HEADER.size:])\n"
        "assert got[3][0].offsets == {'/default/t': 3}, got\n"
        "heavy = sorted(n for n in sys.modules if n.split('.')[0] in ('pyarrow', 'pyiceberg'))\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# The types that stand for a delivery mode, a way of dispatching or the object tier: code asks for their
# behaviour (Topic, Dispatcher, TopicLog methods), not for which one it holds (docs/ARCHITECTURE.md).
MODE_TYPES = {"Topic", "ReliableTopic", "NonReliableTopic", "LiveDispatcher", "ReliableDispatcher",
              "BatchDispatcher", "Tier", "WalOnly", "TopicLog", "GapAwareLog", "CloudReader"}
MAX_MODE_CHECKS = 5


def mode_checks(source: str, path: str) -> list[tuple[int, bool]]:
    """(line, commented) of each isinstance() on a MODE_TYPES type: `commented` when a comment on that line
    or the one above says why."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(isinstance(k, ast.Name) and k.id in MODE_TYPES for k in kinds):
                line = node.lineno
                found.append((line, "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")))
    return found


def test_delivery_modes_are_types_not_branches() -> None:
    checks = {f"{name}:{line}": commented for name, path in modules().items()
              for line, commented in mode_checks(path.read_text(), str(path))}
    assert len(checks) <= MAX_MODE_CHECKS, sorted(checks)
    assert all(checks.values()), f"say why next to each: {sorted(k for k, v in checks.items() if not v)}"


def test_the_mode_check_counter_sees_a_check() -> None:
    source = "def f(t):\n    return isinstance(t, (int, ReliableTopic))\n\n\ndef g(d):\n    # why\n" \
             "    return isinstance(d, BatchDispatcher)\n"
    assert mode_checks(source, "x.py") == [(2, False), (7, True)]


def test_the_log_keeps_recovery_apart() -> None:
    """SegmentedLog holds appends, reads and their locking; recovery (log_loader.py) and the segment files
    (segments.py) are units of their own, so the log stays readable in one sitting."""
    lines = (PACKAGE / "storage" / "segmented_log.py").read_text().count("\n")
    assert lines < 400, f"storage/segmented_log.py has {lines} lines: move a unit out"
    assert "danube_fast.storage.log_loader" in graph()["danube_fast.storage.segmented_log"]
