"""The repository is self-contained: what the code relies on is written in `docs/`, and every citation of a
document points at something a clone has.

- No file cites documents outside the repository (the design notes and seed documents the project started
  from, or their section numbers).
- Every document of docs/ that is cited exists, and every anchor cited (`#heading`) names one of its
  headings.
- Every wire clause cited (`docs/WIRE.md C.7`, or a bare `C.7` in a file that cites docs/WIRE.md) is a
  heading of docs/WIRE.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".pyx", ".pxd", ".pyi", ".md", ".proto", ".toml", ".sh", ".cfg", ".txt", ""}

# Built from parts, so that this file does not match itself.
OUTSIDE = re.compile("|".join([
    r"\.\./" + "shared",
    r"\b(?i:seed)[s]?[ -]?0\d\d",
    r"\bCONTR" + r"ACT\b",
    r"\bDES" + r"IGN(\.md| \d)",
]))
DOC_REF = re.compile(r"docs/([A-Z_]+\.md)(#[a-z0-9_-]+)?")
WIRE_CLAUSE = re.compile(r"\b([A-D]\.\d{1,2})\b")
# Third-party files kept as published (their licence's words are not citations).
VENDORED = ("tests/schema/json_schema_suite/",)


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed
            if (ROOT / name).is_file() and Path(name).suffix in TEXT_SUFFIXES
            and not name.startswith(VENDORED)
            and (not name.startswith("danube_fast/proto/") or name.endswith(".proto"))]


def read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation other than - and _ dropped, spaces
    to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in read(doc).splitlines() if line.startswith("#")]


def wire_clauses() -> set[str]:
    return {m.group(1) for h in headings(ROOT / "docs" / "WIRE.md") if (m := re.match(r"([A-D]\.\d+)\b", h))}


def test_the_file_list_and_the_anchor_rule_work() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in tracked_files()}
    assert {"README.md", "danube_fast/broker/topic_registry.py", "docs/WIRE.md"} <= files
    assert anchor("Election and the controller epoch") == "election-and-the-controller-epoch"
    assert anchor("The state key: sealed state and offset reservation") == \
        "the-state-key-sealed-state-and-offset-reservation"
    assert anchor("A graceful move (unload)") == "a-graceful-move-unload"
    assert {"B.2", "C.7", "D.16"} <= wire_clauses()
    assert OUTSIDE.search("see " + "se" + "ed 004") and OUTSIDE.search("wire/" + "CONTR" + "ACT.md C.7")


def test_nothing_cites_documents_outside_the_repository() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in tracked_files()
             for n, line in enumerate(read(p).splitlines(), 1) if OUTSIDE.search(line)]
    assert found == []


def test_every_cited_doc_and_anchor_exists() -> None:
    missing = []
    for p in tracked_files():
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in DOC_REF.finditer(line):
                doc = ROOT / "docs" / m.group(1)
                if not doc.is_file():
                    missing.append(f"{p.relative_to(ROOT)}:{n}: {m.group(0)} (no such document)")
                elif m.group(2) and m.group(2)[1:] not in {anchor(h) for h in headings(doc)}:
                    missing.append(f"{p.relative_to(ROOT)}:{n}: {m.group(0)} (no such heading)")
    assert missing == []


@pytest.mark.parametrize("suffixes", [(".py", ".pyx", ".pxd", ".proto", ".md")])
def test_every_wire_clause_cited_exists(suffixes: tuple[str, ...]) -> None:
    clauses = wire_clauses()
    unknown = []
    for p in tracked_files():
        text = read(p)
        if p.suffix not in suffixes or "docs/WIRE.md" not in text or p.name == "WIRE.md":
            continue
        for n, line in enumerate(text.splitlines(), 1):
            unknown += [f"{p.relative_to(ROOT)}:{n}: {c}" for c in WIRE_CLAUSE.findall(line)
                        if c not in clauses]
    assert unknown == []
