"""bench/RESULTS.md: one `## ` section per suite, each rewritten only by `python -m bench <suite>
--write-results` from the run that just finished. Other sections and the preamble are kept as they are."""

from __future__ import annotations

import os
from collections.abc import Sequence

from bench.common import TABLE_COLUMNS, Result, describe_machine, table_rows

RESULTS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")

PREAMBLE = """# Benchmark results

Every figure below was written by `python -m bench <suite> --write-results`: do not edit numbers by hand,
rerun the command. What the figures mean and how to get stable ones: [README.md](README.md).
"""


RUNS_NOTE = "CPU figures: --runs; disk figures: more, shorter bracketed pairs"


QUICK_LINE = "- **Quick run** (`--quick`): smaller sizes and shorter timings; not comparable with full runs."


def head_lines(title: str, info: dict[str, object], command: str, date: str, runs_text: str,
               quick: bool) -> list[str]:
    """A section's heading and its list of what was measured where, when and how."""
    lines = [
        f"## {title}",
        "",
        f"- Machine: {describe_machine(info)}",
        f"- Date: {date}",
        f"- Command: `{command}`",
        f"- Runs: {runs_text}; load average at start {info.get('load_average_1m')}",
    ]
    return [*lines, QUICK_LINE] if quick else lines


def render_section(title: str, results: Sequence[Result], info: dict[str, object], command: str, date: str,
                   runs: int, quick: bool, runs_note: str = RUNS_NOTE) -> str:
    """The section's markdown, from its `## ` heading to the table's last line."""
    lines = head_lines(title, info, command, date,
                       f"medians over the `runs` column of the table ({runs_note})", quick)
    lines += ["", "| " + " | ".join(TABLE_COLUMNS) + " |",
              "|:---|---:|:---|---:|---:|---:|:---|:---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join(lines) + "\n"


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(text before the first `## ` heading, [(section title, whole section text)]) in file order."""
    preamble: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line[3:].strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    return "".join(preamble), [(title, "".join(body)) for title, body in sections]


def replace_section(text: str, title: str, section: str) -> str:
    """`text` with the section called `title` replaced by `section` (appended if there is none). The
    preamble and the other sections are kept byte for byte, bar a missing final newline."""
    preamble, sections = split_sections(text)
    if not preamble.strip():
        preamble = PREAMBLE + "\n"
    if not sections or title not in (name for name, _ in sections):
        sections.append((title, ""))
    parts = [preamble if preamble.endswith("\n") else preamble + "\n"]
    for i, (name, body) in enumerate(sections):
        if name != title:
            body = body if body.endswith("\n") else body + "\n"
            if i + 1 < len(sections) and not body.endswith("\n\n"):
                body += "\n"  # a blank line before the next heading
            parts.append(body)
        elif i + 1 < len(sections):
            parts.append(section + "\n")  # a blank line before the next heading
        else:
            parts.append(section)
    return "".join(parts)


def write_section(title: str, section: str, path: str = RESULTS_PATH) -> None:
    """Rewrite one section of the results file (created if missing) by write-then-rename."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(replace_section(text, title, section))
    os.replace(tmp, path)
