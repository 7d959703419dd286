"""The native core's codec, in one place (docs/FORMAT.md, docs/WIRE.md):

* `frames`: the record-batch codec (encode, decode, CRC32C, compression, decode straight to Arrow). It picks
  `_frames` (Cython, with `_crc32c.h` and `_utf8.h`) or its pure-Python twin `_frames_py`
  (DANUBE_FAST_PURE=1); import the codec from `frames` only, so the switch applies everywhere.
* `fast_wire`: the fast API's bulk messages framed without the protobuf runtime's copies.
* `_arrow`: the Arrow schema of decoded batches, with pyarrow imported on first use.

The storage engine's native half (`_wal`, its twin and `wal_engine`) lives with the storage it serves.
"""
