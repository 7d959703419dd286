"""The in-process suites: `python -m bench storage` (the WAL against plain writes, the codec, CRC, index,
reads), `python -m bench meta` (LocalCache, EmbeddedStore, EtcdStore), and the pytest-benchmark
micro-benchmarks of single calls (test_micro.py)."""
