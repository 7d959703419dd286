"""Run one fuzz target under atheris (coverage-guided; libFuzzer's engine) for a bounded time:

    python tests/fuzz/run.py TARGET [--seconds N] [--corpus DIR] [-- libFuzzer flags]

It starts from the target's seeds (targets.py) and the inputs of tests/fuzz/regressions/TARGET/. A failing
input is written as crash-<sha1> in the working directory by libFuzzer and the exit status is non-zero:
copy it to regressions/TARGET/ (test_fuzz.py then replays it in every test run) and fix the bug.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

with atheris.instrument_imports(include=["danube_fast"]):
    import targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=sorted(targets.TARGETS))
    parser.add_argument("--seconds", type=int, default=10, help="stop after this long (default: 10)")
    parser.add_argument("--corpus", type=Path, help="keep the corpus here (default: a temporary directory)")
    args, libfuzzer = parser.parse_known_args()
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix=f"fuzz-{args.target}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for n, seed in enumerate(targets.seeds()[args.target]):
        (corpus / f"seed-{n}").write_bytes(seed)
    regressions = HERE / "regressions" / args.target
    dirs = [str(corpus)] + ([str(regressions)] if regressions.is_dir() else [])
    atheris.Setup([sys.argv[0], f"-max_total_time={args.seconds}", "-rss_limit_mb=2048", "-max_len=65536",
                   *[a for a in libfuzzer if a != "--"], *dirs], targets.TARGETS[args.target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
