"""The int4 CPU kernel (onnx2jax/_native/matmul_nbits.cc), built at install as an optional extension.

Everything else is in pyproject.toml. The kernel is C++17 against a vendored copy of XLA's header-only FFI
API (onnx2jax/_native/include/xla/ffi/api, as jaxlib 0.10.2 ships it under ``jax.ffi.include_dir()``): the
build needs no jaxlib, so an isolated build does not download jaxlib into its build environment, and the
headers are those of the FFI version the runtime's jaxlib speaks (the C API checks struct sizes and versions
at run time). Where no C++ compiler is found, or the build fails, the install still succeeds and says so;
``onnx2jax`` then runs MatMulNBits through its pure-JAX path and notes it once (docs/quantized.md).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MESSAGE = (
    "onnx2jax: the int4 CPU kernel (onnx2jax._native._matmul_nbits) was not built ({}); the install goes on. "
    "MatMulNBits will run through the pure-JAX path, which dequantizes every weight to float on every call "
    "(several times slower on CPU). Install a C++17 compiler (g++ or clang++) and reinstall to build it."
)


class OptionalBuildExt(build_ext):
    """build_ext that reports a missing compiler or a failed build in one clear line instead of failing."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 - no compiler at all (distutils' CCompilerError, PlatformError)
            print(MESSAGE.format(f"{type(error).__name__}: {error}"), file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001 - a compile or link error
            print(MESSAGE.format(f"{type(error).__name__}: {error}"), file=sys.stderr)


KERNEL = Extension(
    "onnx2jax._native._matmul_nbits",
    sources=["onnx2jax/_native/matmul_nbits.cc"],
    include_dirs=["onnx2jax/_native/include"],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-fvisibility=hidden"],
    optional=True,
)

setup(ext_modules=[KERNEL], cmdclass={"build_ext": OptionalBuildExt})
