"""Thousands of sharded calls in a loop: the executions in flight are bounded on CPU devices.

Unbounded, a few hundred queued TP-8 executions abort XLA CPU's all-reduce rendezvous
(docs/known-issues.md); a decode loop makes thousands of calls.
"""

import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.runtime.in_flight import InFlight
from sharding.megatron import megatron_plan

DEMO = "tests/data/tiny_llama.onnx"


@pytest.mark.slow  # a stress run (30 s); the bound and the release are tested below in the default suite
def test_ten_thousand_sharded_calls_run_and_equal_the_unsharded_run():
    model = onnx.load(DEMO)
    ids = np.load("tests/data/tiny_llama.inputs.npz")["input_ids"]
    compiled = onnx2jax.compile(megatron_plan(model, 8))
    (expected,) = onnx2jax.translate(model)(ids)
    results = [compiled(ids)[0] for _ in range(10_000)]  # nothing waits between calls
    assert compiled.report(ids).collectives["all-reduce"] == 5
    np.testing.assert_allclose(np.asarray(results[0]), np.asarray(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(results[-1]), np.asarray(results[0]))


class _Result:
    def __init__(self, log: list, k: int):
        self.log, self.k = log, k

    def block_until_ready(self):
        self.log.append(self.k)
        return self


def test_the_bound_waits_for_the_call_bound_back_and_only_on_several_cpu_devices():
    class Device:
        def __init__(self, platform):
            self.platform = platform

    waited: list[int] = []
    bounded = InFlight([Device("cpu")] * 8, bound=3)
    for k in range(6):
        bounded.admit((_Result(waited, k), None))
    assert waited == [0, 1, 2]  # call k waits for call k - 3
    for devices in ([Device("cpu")], [Device("gpu")] * 8):
        idle: list[int] = []
        free = InFlight(devices, bound=1)
        for k in range(4):
            free.admit(_Result(idle, k))
        assert idle == [] and not free.active
    with pytest.raises(ValueError, match="at least 1"):
        InFlight([Device("cpu")] * 2, bound=0)


def test_a_result_dropped_by_its_caller_keeps_one_device_buffer_alive_not_every_copy():
    """The bound waits on one device's buffer: a replicated output's other copies are freed with the caller's."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    replicated = jax.device_put(np.ones((4, 4), np.float32), NamedSharding(mesh, PartitionSpec()))
    bound = InFlight(mesh.devices.flat)
    assert bound.admit((replicated,))[0] is replicated
    (held,) = bound._queued
    assert len(held.devices()) == 1 and held.shape == (4, 4)


def test_finished_executions_are_not_held():
    """A caller that reads each result (a benchmark, a decode loop) has waited already: the bound then
    holds only the newest call's buffer, not ``bound`` of them (their memory goes with the caller's)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    bound = InFlight(mesh.devices.flat, bound=4)
    for k in range(6):
        result = jax.device_put(np.full((8, 4), k, np.float32), NamedSharding(mesh, PartitionSpec("d")))
        bound.admit((result,)).__getitem__(0).block_until_ready()
    (held,) = bound._queued
    np.testing.assert_array_equal(np.asarray(held), np.full((1, 4), 5, np.float32))
