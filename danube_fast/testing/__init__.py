"""The harness that tests and benchmarks share: real servers (etcd, moto S3, brokers, a fault-injecting
proxy) as processes or threads on free loopback ports. Nothing here imports pytest except `plugin`, the pytest
plugin that tests/conftest.py registers; bench imports the rest.
"""
