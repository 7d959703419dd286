"""The fuzz targets (targets.py): their seeds and every input a fuzz run found (regressions/) replayed on each
test run, and a short coverage-guided run of each target (run.py, atheris) in the slow suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import targets

HERE = Path(__file__).resolve().parent
SECONDS = 8  # per target in the suite; `python tests/fuzz/run.py TARGET --seconds 600` for a long run


def cases() -> list[tuple[str, str, bytes]]:
    out = [(name, f"seed-{n}", data)
           for name, found in targets.seeds().items() for n, data in enumerate(found)]
    for name in targets.TARGETS:
        folder = HERE / "regressions" / name
        if folder.is_dir():
            out += [(name, path.name, path.read_bytes()) for path in sorted(folder.iterdir())]
    return out


@pytest.mark.parametrize(("target", "name", "data"), cases(), ids=[f"{t}-{n}" for t, n, _ in cases()])
def test_known_inputs(target: str, name: str, data: bytes) -> None:
    targets.TARGETS[target](data)


def test_the_seeds_get_past_the_refusals() -> None:
    """A seed that is refused outright would leave the fuzzer exploring the first check only."""
    assert targets._decoded(targets._frames, targets.seeds()["frames"][0][1:], True) != "refused"
    data = targets.seeds()["object_footer"][0]
    assert targets.objects.parse_footer(data).batch_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_a_short_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(HERE / "run.py"), target, "--seconds", str(SECONDS)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=SECONDS * 10, check=False)
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert done.returncode == 0 and not found, f"{found}\n{done.stderr[-4000:]}"
    assert "Done " in done.stderr, done.stderr[-2000:]  # libFuzzer's last line: it ran to its time limit
