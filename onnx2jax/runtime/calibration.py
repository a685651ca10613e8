"""The cost model's rates measured on the real backend, cached per backend (issue 31).

`rates` runs a few micro-benchmarks on the devices JAX offers (fake CPU
devices here, a GPU or TPU where present): for each collective kind, one
small and one large payload over all the devices (a ``shard_map`` of
``psum``, ``all_gather``, ``psum_scatter``, ``ppermute``, ``all_to_all``);
the small one's time (less that of a program with no collective) is the
latency, the large one's extra time over its extra bytes the bandwidth
(through one device, as `sharding.auto.cost` counts bytes); a float32 matrix
product on every device at once gives the FLOP rate (fake CPU devices share
the host's cores); the collective-free program's time is a call's overhead.
Each is the
best of a few timed runs after a warm-up. The result is written to
``$XDG_CACHE_HOME/onnx2jax/rates/<platform>-<device kind>-<n>.json`` (else
``~/.cache``), and read back from there on later calls: a backend is
calibrated once. `sharding.auto.DEFAULT_RATES` stand in where nothing was
calibrated; the report's rates say which.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sharding.auto.analysis import KINDS
from sharding.auto.cost import Rates

_SMALL, _LARGE = 32, 1 << 15  # float32 elements per device, times the device count (all-to-all splits by it)
_MATMUL = 256


def cache_path(devices: list | None = None) -> Path:
    """Where the rates of this backend (its platform, device kind and count) are cached."""
    devices = devices or jax.devices()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    kind = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(devices[0].device_kind))
    return Path(base) / "onnx2jax" / "rates" / f"{devices[0].platform}-{kind}-{len(devices)}.json"


def rates(devices: list | None = None, *, refresh: bool = False, path: Path | None = None) -> Rates:
    """The backend's rates: from the cache, else measured now (and cached).

    Args:
        devices: The devices to measure over (default ``jax.devices()``).
        refresh: Measure again even if cached.
        path: The cache file (default `cache_path`).
    """
    devices = devices or jax.devices()
    path = path or cache_path(devices)
    if path.exists() and not refresh:
        return Rates.from_json(json.loads(path.read_text()))
    found = measure(devices)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(found.to_json(), indent=1))
    except OSError:  # a read-only home: the rates still serve this process
        pass
    return found


def _best(fn: Callable, arg, repeat: int = 5) -> float:
    jax.block_until_ready(fn(arg))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return min(times)


def _collective(kind: str, axis: str) -> Callable:
    n_name = axis
    if kind == "all-reduce":
        return lambda x: jax.lax.psum(x, n_name)
    if kind == "all-gather":
        return lambda x: jax.lax.all_gather(x, n_name, tiled=True)
    if kind == "reduce-scatter":
        return lambda x: jax.lax.psum_scatter(x, n_name, tiled=True)
    if kind == "all-to-all":
        return lambda x: jax.lax.all_to_all(x, n_name, 0, 0, tiled=True)
    return None  # collective-permute: needs the size, built in measure


def measure(devices: list) -> Rates:
    """Runs the micro-benchmarks of the module docstring over ``devices``; no cache involved."""
    n = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    small_size, large_size = _SMALL * n, _LARGE * n
    latency, bandwidth = {}, {}
    sharded = NamedSharding(mesh, PartitionSpec("d"))
    small = jax.device_put(jnp.ones((n * small_size,), jnp.float32), sharded)
    noop = jax.jit(jax.shard_map(lambda x: x + 1, mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d")))
    dispatch = _best(noop, small)  # a call's own cost, taken off each collective's latency
    for kind in KINDS:
        body = _collective(kind, "d")
        if body is None:
            perm = [(i, (i + 1) % n) for i in range(n)]
            body = lambda x, perm=perm: jax.lax.ppermute(x, "d", perm)  # noqa: E731
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d")))
        times = []
        for size in (small_size, large_size):
            x = jax.device_put(jnp.ones((n * size,), jnp.float32), sharded)
            times.append(_best(fn, x))
        latency[kind] = max(times[0] - dispatch, 1e-6)
        result = {"all-gather": n, "reduce-scatter": 1 / n}.get(kind, 1)  # result elements per input element
        moved = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "all-to-all": (n - 1) / n,
                 "reduce-scatter": n - 1, "collective-permute": 1.0}[kind] * result * 4 * (large_size - small_size)
        bandwidth[kind] = moved / max(times[1] - times[0], 1e-9) if n > 1 else 1e12
    # Every device multiplies its own matrix at once: fake CPU devices share the host's cores.
    a = jax.device_put(jnp.ones((n * _MATMUL, _MATMUL), jnp.float32), NamedSharding(mesh, PartitionSpec("d")))
    product = jax.jit(jax.shard_map(lambda x: x @ x, mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d")))
    flops = 2 * _MATMUL**3 / max(_best(product, a) - dispatch, 1e-9)
    source = f"calibrated on {devices[0].platform} ({devices[0].device_kind}, {n} devices)"
    return Rates(latency=latency, bandwidth=bandwidth, flops=flops, overhead=dispatch, source=source)


__all__ = ["cache_path", "measure", "rates"]
