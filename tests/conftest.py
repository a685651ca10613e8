"""Test setup: 8 fake CPU devices, so that every sharded run has a mesh; and a compilation cache that stays put.

The CLI turns on JAX's persistent compilation cache (onnx2jax.runtime.compilation_cache), by default in the
user's ``~/.cache/onnx2jax/xla``. Tests point it at a temporary folder, deleted at the end of the session,
through ``ONNX2JAX_CACHE_DIR`` (so every subprocess a test starts inherits it too); and since the cache is a
process-wide jax setting, a CLI command run in this process turns it off again when its test ends, so that the
later tests neither write executables nor pay for writing them. The other caches onnx2jax keeps under
``$XDG_CACHE_HOME`` (the automatic plans' measured rates, onnx2jax.runtime.calibration) go to a temporary
folder too, shared by the session so that the rates are measured once.
"""

import atexit
import os
import shutil
import tempfile

# The test extra installs libtpu (jax[tpu]) so that programs compile for TPU topologies on this CPU machine.
# With it, every jax start would also try to open a TPU (and print libtpu's warnings): the tests run on CPU
# devices, so say so before jax starts, for this process and every subprocess. Compile-only TPU devices
# (jax.experimental.topologies) still work; several processes may load libtpu at once (pytest-xdist workers).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache as jax_cache

jax.config.update("jax_num_cpu_devices", 8)

TEST_CACHE_DIR = tempfile.mkdtemp(prefix="onnx2jax-tests-xla-")
os.environ["ONNX2JAX_CACHE_DIR"] = TEST_CACHE_DIR
atexit.register(shutil.rmtree, TEST_CACHE_DIR, True)
TEST_XDG_CACHE = tempfile.mkdtemp(prefix="onnx2jax-tests-cache-")
os.environ["XDG_CACHE_HOME"] = TEST_XDG_CACHE
atexit.register(shutil.rmtree, TEST_XDG_CACHE, True)


@pytest.fixture(autouse=True)
def _persistent_cache_off_after_each_test():
    yield
    if jax.config.jax_compilation_cache_dir is not None:
        jax.config.update("jax_compilation_cache_dir", None)
        jax_cache.reset_cache()
