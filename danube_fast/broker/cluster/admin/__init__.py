"""The admin API in cluster mode: `ops` (cluster operations as metadata reads and writes: unload, drain,
activate, balance) and `service` (the DanubeAdmin gRPC service over the whole cluster, extending the
standalone one in broker/services/admin.py). The command line client is danube_fast/cli/admin.py.
"""
