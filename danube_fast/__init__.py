"""danube_fast: a Danube-compatible messaging broker with a native (Cython) hot path."""

__version__ = "0.1.0"
