"""One open of a WAL directory at a time in this process: the engines (segmented_log.py) register their
directory before recovery and leave when closed.

Two opens of one directory would each recover it: one cutting a torn tail or making the active segment's
index afresh (which truncates the file first) while the other has those files mapped, which kills the
process with SIGBUS; or both appending. Refusing the second open turns that into an error its caller
handles. A registry rather than a lock file: an idle log gives back every descriptor (`release`), and a
lock would hold one per topic. An engine dropped without close (a test's simulated crash) frees its
directory when it is collected.
"""

from __future__ import annotations

import threading
import weakref

from danube_fast.errors import WalBusy

_lock = threading.Lock()
_open: dict[str, weakref.ref[object]] = {}


def claim(directory: str, log: object) -> None:
    """Register `log` as the one open of `directory` (an absolute path); WalBusy if another holds it."""
    with _lock:
        held = _open.get(directory)
        if held is not None and held() is not None:
            raise WalBusy(f"the WAL in {directory} is open already in this process; a directory is one "
                          "log's, opened once")
        _open[directory] = weakref.ref(log)


def leave(directory: str, log: object) -> None:
    with _lock:
        held = _open.get(directory)
        if held is not None and held() in (log, None):
            del _open[directory]
