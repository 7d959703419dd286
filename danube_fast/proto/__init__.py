"""Danube wire schemas and the protobuf/gRPC code generated from them.

The ``.proto`` files here are written by hand from Danube's descriptors (docs/WIRE.md A.1-A.4):

* ``DanubeApi.proto`` (package ``danube``): the data plane, identical to the descriptor inside
  ``danube-client`` 0.5.0;
* ``SchemaRegistry.proto`` (package ``danube_schema``): identical to the client's and to broker v0.7.3's;
* ``DanubeAdmin.proto`` (package ``danube_admin``): broker v0.7.3's admin API;
* ``FastApi.proto`` (package ``danube_fast.v1``): our own fast path, streams of record batches.

Everything else in this package is generated: ``*_pb2.py`` (messages), ``*_pb2.pyi`` (their types) and
``*_pb2_grpc.py`` (stubs and servicers), produced by ``make proto`` with the pinned grpcio-tools of the
``test`` extra, sibling imports rewritten to be package-relative by ``scripts/fix_proto_imports.py``.
Never edit them by hand: change a ``.proto`` file and run ``make proto``. The generated files are checked in,
so nothing here needs protoc at runtime. ``tests/compat/test_descriptor_parity.py`` checks that the
descriptors match the client's byte for byte (and A.4's table for the admin API) and that the checked-in
files are what ``make proto`` produces.

Our descriptors register under the same file names as the client's (``DanubeApi.proto``,
``SchemaRegistry.proto``), so both can be imported in one process only because they are byte-identical.
"""
