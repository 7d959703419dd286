"""Benchmarks for danube_fast: `python -m bench storage` (end-to-end figures with a plain-disk baseline) and
`bench/test_micro.py` (pytest-benchmark micro-benchmarks). How to get stable numbers: bench/README.md."""
