"""The WAL engine: native (Cython) unless DANUBE_FAST_PURE=1 selects the pure-Python twin.

Import SegmentedLog from here, never from `_wal` or `_wal_py` directly, so the switch applies everywhere.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

PURE = os.environ.get("DANUBE_FAST_PURE", "") == "1"

# The type checker reads the native module's .pyi; the twin implements the same API.
if PURE and not TYPE_CHECKING:
    from danube_fast._wal_py import SegmentedLog
else:
    from danube_fast._wal import SegmentedLog

IMPL = "pure" if PURE else "native"

__all__ = ["IMPL", "SegmentedLog"]
