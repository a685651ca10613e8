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

import jax
import pytest
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
