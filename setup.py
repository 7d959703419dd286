"""Extension list only; everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

COMPILE_ARGS = ["-O3", "-Wall"]

extensions = [
    Extension("danube_fast._frames", ["danube_fast/_frames.pyx"], extra_compile_args=COMPILE_ARGS),
    Extension("danube_fast._wal", ["danube_fast/_wal.pyx"], extra_compile_args=COMPILE_ARGS),
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
)
