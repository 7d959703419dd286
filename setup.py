"""Extension list only; everything else is in pyproject.toml.

DANUBE_FAST_DEBUG=1 builds the debug variant: bounds and wraparound checks on, line tracing (coverage and
profilers see .pyx lines), no optimisation. `make test-debug` runs the core's tests on it.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("DANUBE_FAST_DEBUG") == "1"

if DEBUG:
    COMPILE_ARGS = ["-O0", "-g", "-Wall"]
    MACROS = [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    DIRECTIVES = {"boundscheck": True, "wraparound": True, "cdivision": False, "linetrace": True}
else:
    COMPILE_ARGS = ["-O3", "-Wall"]
    MACROS = []
    DIRECTIVES = {"boundscheck": False, "wraparound": False, "cdivision": True}

extensions = [
    # libzstd and liblz4: the batch compression codecs (docs/FORMAT.md#compression); Debian's libzstd-dev and
    # liblz4-dev at build time (scripts/system-deps.sh), libzstd1 and liblz4-1 at run time.
    Extension("danube_fast.codec._frames", ["danube_fast/codec/_frames.pyx"], extra_compile_args=COMPILE_ARGS,
              define_macros=MACROS, libraries=["zstd", "lz4"]),
    Extension("danube_fast.storage._wal", ["danube_fast/storage/_wal.pyx"], extra_compile_args=COMPILE_ARGS,
              define_macros=MACROS),
]

setup(
    ext_modules=cythonize(extensions, language_level=3, compiler_directives=DIRECTIVES,
                          # the debug variant's C differs: regenerate rather than reuse the release's
                          force=DEBUG),
)
