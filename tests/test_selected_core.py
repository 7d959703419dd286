"""The native core is the one running unless DANUBE_FAST_PURE=1 asks for the twins."""

import os

from danube_fast.codec import frames
from danube_fast.storage import wal_engine


def test_selected_core_matches_the_switch() -> None:
    want = "pure" if os.environ.get("DANUBE_FAST_PURE") == "1" else "native"
    assert want == frames.IMPL
    assert want == wal_engine.IMPL
    module = {"native": ("danube_fast.codec._frames", "danube_fast.storage._wal"),
              "pure": ("danube_fast.codec._frames_py", "danube_fast.storage._wal_py")}[want]
    assert frames.Record.__module__ == module[0]
    assert wal_engine.segments.__name__ == module[1]
    if want == "native":
        assert frames.encode_batch.__module__ == "danube_fast.codec._frames"
        compiled = ("builtin_function_or_method", "cython_function_or_method")
        assert type(frames.encode_batch).__name__ in compiled
