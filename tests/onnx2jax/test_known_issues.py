"""Upstream bugs we work around: each reproducer in plain JAX, and our run beside it.

Each ``..._is_still_there`` test fails once upstream fixes the bug, so that
the workaround (see docs/known-issues.md) can go.
"""

import os

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import onnx2jax
from sharding.spec import ShardingSpec


def test_xla_strided_slice_bug_is_still_there():
    mesh = Mesh(np.array(jax.devices()[:2]), ("d0",))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)

    def f(x):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, "d0")))
        return jax.lax.slice(x, (0, 1), (4, 2), (1, 3))

    got = np.asarray(jax.jit(f)(x))
    assert not np.array_equal(got, x[:, 1:2:3]), (
        "upstream fixed it: remove the workaround (onnx2jax/ops/_slices.py canonical slices) "
        "and its entry in docs/known-issues.md"
    )
    np.testing.assert_array_equal(got, x[:, 0:1])  # the known wrong answer, column 0


def _sliced_model(shape, starts, ends, axes, steps, *specs):
    node = oh.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="slice0")
    config = node.device_configurations.add()
    config.configuration_id = "tp"
    for spec in specs:
        config.sharding_spec.add().CopyFrom(spec.to_proto())
    inits = [
        oh.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values)
        for name, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))
    ]
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    num_devices = max(max(spec.devices) for spec in specs) + 1
    model.configuration.add().CopyFrom(onnx.DeviceConfigurationProto(name="tp", num_devices=num_devices))
    return model


@pytest.mark.filterwarnings("ignore:output 'y'.*do not divide")
def test_strided_slices_on_sharded_axes_take_the_right_elements():
    """Each case was wrong (or an XLA verifier crash) before slices were canonical."""
    cols2, cols8 = (ShardingSpec.split(t, {1: 2}, [0, 1]) for t in "xy"), (ShardingSpec.split(t, {1: 8}, range(8)) for t in "xy")
    cols2, cols8 = list(cols2), list(cols8)
    rows8 = [ShardingSpec.split(t, {0: 8}, [7, 6, 5, 4, 3, 2, 1, 0]) for t in "xy"]
    cases = [
        ((4, 2), [1], [2], [1], [3], cols2),  # the reproducer's slice: was column 0
        ((4, 2), [1], [2], [1], [5], cols8),  # was column 0
        ((4, 4), [3], [4], [1], [3], cols8),  # was an XLA verifier crash
        ((4, 6), [5], [6], [1], [5], cols8),  # was an XLA verifier crash
        ((4, 8), [1], [8], [1], [5], cols8),
        ((6, 4), [5], [0], [0], [-2], [ShardingSpec.split("x", {0: 2}, [1, 0])]),
        ((8, 4), [-1], [-9], [0], [-3], rows8),
    ]
    for shape, starts, ends, axes, steps, specs in cases:
        model = _sliced_model(shape, starts, ends, axes, steps, *specs)
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        (got,) = onnx2jax.compile(model)(x)
        index = [slice(None)] * len(shape)
        index[axes[0]] = slice(starts[0], ends[0] if ends[0] >= -shape[axes[0]] else None, steps[0])
        np.testing.assert_array_equal(np.asarray(got), x[tuple(index)], err_msg=f"{shape} {starts}:{ends}:{steps}")


RENDEZVOUS_REPRODUCER = """
import jax, jax.numpy as jnp
jax.config.update("jax_num_cpu_devices", 8)
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P("x", None)))
x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P(None, "x")))
f = jax.jit(lambda x, w: jnp.tanh(x @ w))
outs = [f(x, w) for _ in range(3000)]
jax.block_until_ready(outs)
print("all calls ran")
"""


@pytest.mark.slow
def test_xla_cpu_rendezvous_abort_is_still_there():
    """3,000 queued TP-8 executions abort XLA CPU's all-reduce rendezvous (docs/known-issues.md).

    When this fails, jax runs them all: onnx2jax.runtime.in_flight can go.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-c", RENDEZVOUS_REPRODUCER], capture_output=True, text=True, timeout=600, env=env
    )
    if done.returncode == 0 and "all calls ran" in done.stdout:
        pytest.fail("upstream fixed it: 3,000 queued sharded calls ran; remove onnx2jax/runtime/in_flight.py")
    assert "RendezvousKey" in done.stderr, done.stderr[-2000:]


def test_xla_gathers_a_grouped_conv_split_by_groups_still():
    """XLA gathers a grouped conv (8 channels per group) split on whole groups; depthwise stays local."""
    import re

    mesh = Mesh(np.array(jax.devices()[:4]), ("c",))
    x = np.ones((2, 64, 19), np.float32)

    def gathered(channels_per_group: int) -> list[str]:
        w = np.ones((64, channels_per_group, 16), np.float32)

        def f(x, w):
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, "c")))
            w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, PartitionSpec("c")))
            y = jax.lax.conv_general_dilated(x, w, (1,), [(8, 8)], feature_group_count=64 // channels_per_group)
            return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, PartitionSpec(None, "c")))

        return re.findall(r"= (\S+) all-gather\(", jax.jit(f).lower(x, w).compile().as_text())

    assert gathered(1) == []  # depthwise: local
    assert gathered(8) != [], (
        "upstream fixed it: remove the workaround (onnx2jax.ops.conv.conv_by_groups and "
        "ShardingHooks._groups_split) and its entry in docs/known-issues.md"
    )


SHARD_MAP_EXPORT_REPRODUCER = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
import numpy as np
from jax import export
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
w = jax.device_put(np.ones((16, 64), np.float32), NamedSharding(mesh, P(None, "d")))

def f(x, w):
    stack = jax.lax.with_sharding_constraint(jnp.broadcast_to(x[None], (8, *x.shape)), NamedSharding(mesh, P("d")))
    return jax.shard_map(lambda s, w: s[0] @ w, mesh=mesh, in_specs=(P("d"), P(None, "d")), out_specs=P("d"))(stack, w)

(batch,) = export.symbolic_shape("batch")
with jax.set_mesh(mesh):
    exported = export.export(jax.jit(f))(jax.ShapeDtypeStruct((batch, 16), np.float32), w)
    np.asarray(exported.call(np.ones((3, 16), np.float32), w))
print("called")
"""


def test_exported_shard_map_with_a_symbolic_batch_still_crashes():
    """Calling an exported shard_map with a symbolic batch segfaults jax 0.10.2 (docs/known-issues.md).

    When this fails, the call runs: onnx2jax.runtime.stacks.column_parallel can
    use its per-device product under a symbolic dimension too.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-c", SHARD_MAP_EXPORT_REPRODUCER], capture_output=True, text=True, timeout=300, env=env
    )
    if done.returncode == 0 and "called" in done.stdout:
        pytest.fail("upstream fixed it: remove the symbolic-dimension fallback of runtime/stacks.column_parallel")
    assert done.returncode == -11 or "Segmentation fault" in done.stderr, (done.returncode, done.stderr[-2000:])


UNIT_AXIS_RESHAPE_REPRODUCER = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("d0", "d1"))
c = lambda x, *spec: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))
f = lambda y: c(c(y.reshape(3, 4, 1, 1), None, "d0", None, "d1").reshape(12, 1), "d1")
out = jax.jit(f)(np.arange(12, dtype=np.float32).reshape(12, 1))
print("ran", np.asarray(out).ravel().tolist() == list(range(12)))
"""


def test_xla_reshape_of_a_split_size_1_axis_still_crashes():
    """A reshape of an operand whose size-1 axis is split (beside another split axis) segfaults XLA's SPMD
    partitioner in jax 0.10.2 (docs/known-issues.md).

    When this fails, the reshape compiles: ShardingHooks._unit_axes_whole (runtime/constraints.py) can go.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-c", UNIT_AXIS_RESHAPE_REPRODUCER], capture_output=True, text=True, timeout=300, env=env
    )
    if done.returncode == 0 and "ran" in done.stdout:
        pytest.fail("upstream fixed it: remove ShardingHooks._unit_axes_whole from runtime/constraints.py")
    assert done.returncode == -11 or "Segmentation fault" in done.stderr, (done.returncode, done.stderr[-2000:])

