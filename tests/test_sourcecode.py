"""ruff and mypy are part of the suite (asyncpg's tests/test__sourcecode.py does the same)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff() -> None:
    r = _run("ruff", "check", "danube_fast", "spark", "bench", "tests")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy() -> None:
    r = _run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr
