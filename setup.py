"""Build the Cython binding over the C engine in native/.

All C sources compile with the same portable flags: SIMD code paths carry
their own target attributes and are chosen at run time, so one wheel runs on
machines with AVX-512, AVX2 or neither.
"""
import glob
import os
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

native_sources = sorted(glob.glob(os.path.join("native", "src", "*.c")))
extra_compile_args = ["-std=c11", "-O2", "-D_GNU_SOURCE", "-fno-strict-aliasing"]
if os.environ.get("COLIBRI_DEBUG"):
    extra_compile_args = ["-std=c11", "-O0", "-g", "-D_GNU_SOURCE"]
if sys.platform == "win32":
    extra_compile_args = ["/O2"]

ext = Extension(
    "colibri_lab._engine",
    sources=[os.path.join("colibri_lab", "_engine.pyx")] + native_sources,
    include_dirs=[os.path.join("native", "include"), os.path.join("native", "src"), numpy.get_include()],
    extra_compile_args=extra_compile_args,
    libraries=["m", "pthread"] if sys.platform != "win32" else [],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(ext_modules=cythonize([ext], language_level=3, compiler_directives={"embedsignature": True}))
