"""Benchmarks for danube_fast, one module or subpackage per suite of `python -m bench SUITE`: micro/ (storage,
meta, and the pytest-benchmark micro-benchmarks), broker/, fast.py, spark.py, e2e/ (with peers/, the same
workload against NATS and Redis), cluster/. Servers are started by the harness (danube_fast/testing). How to
get stable numbers: bench/README.md."""
