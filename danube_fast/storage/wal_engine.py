"""The WAL's segment primitives: native (Cython) unless DANUBE_FAST_PURE=1 selects the pure-Python twin.

The log itself (storage/segmented_log.py) is written once and takes its primitives from here, so the switch
applies everywhere; nothing else imports `_wal` or `_wal_py` directly.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

PURE = os.environ.get("DANUBE_FAST_PURE", "") == "1"

# The type checker reads the native module's .pyi; the twin implements the same API.
if PURE and not TYPE_CHECKING:
    import danube_fast.storage._wal_py as segments
else:
    import danube_fast.storage._wal as segments

IMPL = "pure" if PURE else "native"

__all__ = ["IMPL", "segments"]
