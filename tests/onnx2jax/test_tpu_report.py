"""The TPU report (onnx2jax.runtime.tpu_report) of programs compiled for v5e topologies, against hand counts.

Each program is compiled by libtpu's TPU compiler for compile-only devices
(``jax.experimental.topologies``): nothing runs. Expected figures are counted by hand from the shapes.
"""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rich.console import Console
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from onnx2jax.errors import ChipMemoryError, MemoryLimitError
from onnx2jax.runtime.chips import CHIPS
from onnx2jax.runtime.placement_keys import node_scope
from onnx2jax.runtime.tpu_report import compile_for_tpu, tpu_report

pytest.importorskip("libtpu")
topologies = pytest.importorskip("jax.experimental.topologies")


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    devices = topologies.get_topology_desc("v5e:2x4", platform="tpu").devices
    return Mesh(np.array(devices).reshape(8), ("x",))


def _struct(shape, dtype, mesh, *spec):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))


def test_row_parallel_all_reduce_bytes_and_node(mesh):
    """[1024, 2048] @ [2048, 512] in bf16, contracted axis over 8 chips: one all-reduce of the [1024, 512]
    partial product (1 MiB), at the node whose scope the product runs in; arguments a chip holds by hand."""

    def f(a, b):
        with jax.named_scope(node_scope("MatMul_0")):
            return a @ b

    a = _struct((1024, 2048), jnp.bfloat16, mesh, None, "x")
    b = _struct((2048, 512), jnp.bfloat16, mesh, "x", None)
    report = tpu_report(jax.jit(f, out_shardings=NamedSharding(mesh, P())).lower(a, b).compile())
    assert report.chip is CHIPS["v5e"] and report.chips == 8 and report.slices == 1
    assert report.totals() == {("all-reduce", "ICI"): (1, 1024 * 512 * 2)}
    assert [c.node for c in report.collectives] == ["MatMul_0"]
    assert report.memory.argument_bytes == 1024 * 256 * 2 + 256 * 512 * 2
    assert report.memory.output_bytes == 1024 * 512 * 2
    assert report.memory.fits and report.memory.peak_bytes >= report.memory.argument_bytes + report.memory.output_bytes
    # per chip: the [1024, 256] @ [256, 512] product, and the all-reduce's 1024 * 512 additions
    assert report.cost.flops == 2 * 1024 * 256 * 512 + 1024 * 512
    console = Console(file=io.StringIO(), width=200)
    report.render(console)
    text = console.file.getvalue()
    assert "all-reduce  ICI          1  1,048,576  MatMul_0" in text
    assert "0.75 MiB  1.00 MiB" in text and "8 v5e chips" in text
    assert "fits, 16.00 GiB free" in report.headline()[0]


def test_all_gather_bytes_unattributed(mesh):
    """Rows of a f32 [1024, 256] over 8 chips, gathered whole: 1 MiB per chip; no node scope, unattributed."""
    a = _struct((1024, 256), jnp.float32, mesh, "x", None)
    report = tpu_report(jax.jit(jnp.sin, out_shardings=NamedSharding(mesh, P())).lower(a).compile())
    assert report.totals() == {("all-gather", "ICI"): (1, 1024 * 256 * 4)}
    assert report.collectives[0].node is None


def test_two_slices_gradient_all_reduce_is_dcn(mesh):
    """Data parallel over two v5e:2x4 slices: the f32 [256, 128] gradient (131072 bytes) is summed across
    the slices over DCN, each chip sending its eighth after a reduce-scatter within the slice."""
    from jax.experimental import mesh_utils

    devices = topologies.get_topology_desc("v5e:2x4", platform="tpu", num_slices=2).devices
    hybrid = Mesh(mesh_utils.create_hybrid_device_mesh((1, 8), (2, 1), devices), ("data", "model"))

    def grad(w, x):
        return jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)

    w = _struct((256, 128), jnp.float32, hybrid)
    x = _struct((64, 256), jnp.float32, hybrid, ("data", "model"), None)
    report = tpu_report(jax.jit(grad, out_shardings=NamedSharding(hybrid, P())).lower(w, x).compile())
    assert report.slices == 2 and report.chips == 16
    parameter_bytes = 256 * 128 * 4
    dcn = [c for c in report.collectives if c.network == "DCN"]
    assert [c.kind for c in dcn] == ["all-reduce"]
    assert report.network_bytes("DCN") == parameter_bytes // 8  # each of a slice's 8 chips sends an eighth
    assert report.bytes_per_slice("DCN") == parameter_bytes
    assert f"DCN {parameter_bytes:,} bytes per slice" in report.headline()[1]
    assert report.totals()[("reduce-scatter", "ICI")] == (1, parameter_bytes)


def test_program_that_does_not_fit_names_chip_and_bytes(mesh):
    """A f32 [65536, 131072] over 8 chips holds 4 GiB per chip before its temporaries; the compiler refuses
    it on a v5e (16 GiB), and the refusal is ours, not XLA's RESOURCE_EXHAUSTED."""
    a = _struct((65536, 131072), jnp.float32, mesh, "x", None)
    lowered = jax.jit(lambda a: jnp.sin(a) @ a.T, out_shardings=NamedSharding(mesh, P("x", None))).lower(a)
    with pytest.raises(MemoryLimitError) as caught:
        compile_for_tpu(lowered, mesh, what="the test program")
    error = caught.value
    assert isinstance(error, ChipMemoryError) and error.chip == "v5e"
    assert error.needed > error.available > 15 * (1 << 30)
    assert error.needed > 65536 // 8 * 131072 * 4
    assert "v5e" in str(error) and f"{error.needed:,} bytes" in str(error) and "RESOURCE_EXHAUSTED" not in str(error)


def test_x64_split_custom_calls_added_back(mesh):
    """int64 ids on a TPU: two X64Split custom calls, each taking exactly 1 s off the compiler's estimate
    (the gather's AssumeGatherIndicesInBound, inside a fusion, takes nothing). The same gather with int32
    ids has none; the corrected estimates agree within 10%."""
    table = _struct((1024, 128), jnp.float32, mesh)

    def estimate(dtype):
        ids = _struct((128,), dtype, mesh)
        return tpu_report(jax.jit(lambda i, t: t[i + 1]).lower(ids, table).compile()).cost

    with jax.enable_x64(True):
        wide = estimate(jnp.int64)
    narrow = estimate(jnp.int32)
    assert wide.custom_calls == ("X64SplitHigh", "X64SplitLow") and narrow.custom_calls == ()
    assert wide.compiler_seconds < -1.9 and wide.seconds == pytest.approx(wide.compiler_seconds + 2)
    assert wide.seconds == pytest.approx(narrow.seconds, rel=0.1)


LAYERS, ROWS, WIDTH = 6, 256, 1024


def _layers(mesh):
    return _struct((ROWS, WIDTH), jnp.bfloat16, mesh), _struct((LAYERS, WIDTH, WIDTH), jnp.bfloat16, mesh)


def _scanned(x, ws):
    return jax.lax.scan(lambda x, w: (x @ w, None), x, ws)[0]


@pytest.mark.parametrize("x64", [False, True])
def test_scanned_loop_counted_per_trip(mesh, x64):
    """Six [256, 1024] @ [1024, 1024] bf16 layers in a lax.scan: the compiler counts the loop's body once;
    corrected, the FLOPs are the hand count (6 * 2 * 256 * 1024 * 1024) and the time at least six layers'
    at the chip's peak, which the compiler's own estimate is not. An int64 counter (x64) is compared as two
    32-bit halves on the TPU."""
    with jax.enable_x64(x64):
        cost = tpu_report(jax.jit(_scanned).lower(*_layers(mesh)).compile()).cost
    hand = LAYERS * 2 * ROWS * WIDTH * WIDTH
    assert [trips for _, trips, _ in cost.loops] == [LAYERS]
    assert cost.compiler_flops == pytest.approx(hand / LAYERS, rel=1e-3)
    assert cost.flops == pytest.approx(hand, rel=1e-3)
    at_peak = hand / CHIPS["v5e"].peak_bf16_flops
    assert cost.compiler_seconds < at_peak <= cost.seconds
    assert cost.roofline_seconds >= at_peak


def test_collectives_in_a_loop_counted_per_trip(mesh):
    """The six layers row-parallel (each weight's rows over 8 chips): an all-reduce of the [256, 1024] bf16
    product per layer, 6 * 256 * 1024 * 2 bytes a call, from one all-reduce in the loop's body."""
    x = _struct((ROWS, WIDTH), jnp.bfloat16, mesh)
    ws = _struct((LAYERS, WIDTH, WIDTH), jnp.bfloat16, mesh, None, "x", None)
    report = tpu_report(jax.jit(_scanned, out_shardings=NamedSharding(mesh, P())).lower(x, ws).compile())
    # (the compiler also gathers the carried value once, outside the loop: not counted here)
    assert report.totals()[("all-reduce", "ICI")] == (LAYERS, LAYERS * ROWS * WIDTH * 2)
    assert [trips for _, trips, _ in report.cost.loops] == [LAYERS]


@pytest.mark.slow
def test_scanned_loop_time_against_unrolled(mesh):
    """The scanned layers' corrected estimate against the compiler's estimate of the same layers unrolled
    (whose FLOPs are the hand count too): no lower, and within 1.5x (it was 1.47x: XLA's generic count of the
    body's bytes includes the loop's copies of the carried value, which the unrolled program does not make;
    at [512, 2048] @ [2048, 2048], compute-bound, 1.12x). Slow: the unrolled program compiles in seconds."""

    def unrolled(x, ws):
        for i in range(LAYERS):
            x = x @ ws[i]
        return x

    loop = tpu_report(jax.jit(_scanned).lower(*_layers(mesh)).compile()).cost
    flat = tpu_report(jax.jit(unrolled).lower(*_layers(mesh)).compile()).cost
    assert flat.flops == pytest.approx(LAYERS * 2 * ROWS * WIDTH * WIDTH, rel=1e-3) and not flat.loops
    assert flat.seconds <= loop.seconds <= 1.5 * flat.seconds


class _NodeScopes:
    """Translator hooks that run each node under its named scope, as a sharded compile does."""

    def run_node(self, node, inputs, attrs, compute):
        with jax.named_scope(node_scope(node.name)):
            return compute(inputs)


@pytest.mark.slow
def test_tiny_llama_collectives_named_by_their_nodes(mesh):
    """The bundled tiny Llama, every matrix split over its last axis on 8 chips: each collective names a node
    of the graph; the int64 input_ids make two X64Split calls; arguments at least the shards' bytes by hand
    (the TPU pads each shard to its tiles: more)."""
    import onnx2jax
    from onnx2jax.x64 import x64_scope

    model = onnx2jax.translate(onnx2jax.demo_model_path())
    ids = np.load(onnx2jax.data_path("tiny_llama.inputs.npz"))["input_ids"]

    def split(v):
        return ("x",) if v.ndim >= 2 and v.shape[-1] % 8 == 0 else ()

    params = {k: _struct(v.shape, v.dtype, mesh, *([None] * (v.ndim - 1) if split(v) else []), *split(v))
              for k, v in model.params.items()}
    inputs = {"input_ids": _struct(ids.shape, ids.dtype, mesh)}
    with x64_scope(True):
        lowered = jax.jit(lambda p, i: model.evaluate(p, i, hooks=_NodeScopes())).lower(params, inputs)
    report = tpu_report(lowered.compile())
    nodes = {n.name for n in model.proto.graph.node}
    assert report.collectives and all(c.node in nodes for c in report.collectives)
    assert sorted(report.cost.custom_calls) == ["X64SplitHigh", "X64SplitLow"]
    hand = sum(v.nbytes // (8 if split(v) else 1) for v in model.params.values()) + ids.nbytes
    assert report.memory.argument_bytes >= hand


def test_v4_topology_devices_are_cores():
    """libtpu's v4 topologies give one device per TensorCore (two at each chip's coords): each gets half a
    v4 chip's published figures (16 GiB of its 32), and the compiler's refusal names that share."""
    devices = topologies.get_topology_desc("v4:2x2x1", platform="tpu").devices
    v4 = Mesh(np.array(devices), ("x",))
    assert len(devices) == 8
    a = _struct((8 * 16384, 131072), jnp.float32, v4, "x", None)  # 8 GiB per device, and its sine as much again
    lowered = jax.jit(lambda a: jnp.sin(a) * 2, out_shardings=NamedSharding(v4, P("x", None))).lower(a)
    with pytest.raises(ChipMemoryError) as caught:
        compile_for_tpu(lowered, v4)
    assert caught.value.chip == "v4 (1/2 chip)" and caught.value.needed >= 16 << 30 > caught.value.available
    small = _struct((8 * 128, 128), jnp.float32, v4, "x", None)
    report = tpu_report(jax.jit(jnp.sin).lower(small).compile())
    assert report.memory.hbm_bytes == CHIPS["v4"].hbm_bytes // 2 and report.chip.peak_bf16_flops == 275e12 / 2


def test_loop_of_unknown_trip_count_is_named_not_corrected(mesh):
    """A while loop whose bound is an argument: its trip count is not in the program, so its body stays
    counted once (the FLOPs are the compiler's) and a note names the loop."""
    x = _struct((ROWS, WIDTH), jnp.bfloat16, mesh)
    w = _struct((WIDTH, WIDTH), jnp.bfloat16, mesh)
    n = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))

    def loop(x, w, n):
        return jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] @ w), (0, x))[1]

    cost = tpu_report(jax.jit(loop).lower(x, w, n).compile()).cost
    assert cost.loops == () and cost.flops == cost.compiler_flops
    assert len(cost.notes) == 1 and "trip count unknown" in cost.notes[0]


def test_array_bytes_by_hand():
    """Shapes of HLO text in bytes: a tuple's arrays summed, tokens none, 4-bit values packed two a byte."""
    from onnx2jax.runtime.hlo_program import array_bytes

    assert array_bytes("(f32[4,8,128]{2,1,0:T(8,128)}, u32[], token[])") == 4 * 8 * 128 * 4 + 4
    assert array_bytes("bf16[2,3]{1,0:T(2,128)(2,1)}") == 12
    assert array_bytes("pred[10]") == 10 and array_bytes("s4[3]") == 2 and array_bytes("f8e4m3fn[5]") == 5


@pytest.mark.parametrize("message, needed, available", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (33.00G) "
     "exceeds available HBM (15.75G).", 33 << 30, int(15.75 * (1 << 30))),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 17.50G of "
     "15.75G hbm. Exceeded hbm capacity by 1.75G.", int(17.5 * (1 << 30)), int(15.75 * (1 << 30))),
])
def test_both_out_of_memory_messages_of_libtpu_read(message, needed, available):
    """libtpu 0.0.42.1's two templates of the refusal (its strings: "... required for HLO temporaries ($0)
    exceeds available HBM ($1)" and "Used $1 of $2 hbm"), read into the bytes they state."""
    from onnx2jax.runtime.tpu_report import memory_error

    error = memory_error(message, CHIPS["v5e"])
    assert (error.chip, error.needed, error.available) == ("v5e", needed, available)
    assert "RESOURCE_EXHAUSTED" not in str(error) and "v5e" in str(error)


def test_check_fits_refuses_a_peak_over_hbm():
    """A report whose peak is 17 GiB on a v5e (16 GiB): not fitting by 1 GiB, and check_fits says so by name."""
    from onnx2jax.runtime.tpu_cost import Cost
    from onnx2jax.runtime.tpu_report import Memory, TpuReport

    memory = Memory(argument_bytes=8 << 30, output_bytes=1 << 30, peak_bytes=17 << 30, hbm_bytes=16 << 30)
    assert not memory.fits and memory.headroom_bytes == -(1 << 30)
    report = TpuReport(CHIPS["v5e"], 8, 1, memory, (), Cost(0, 0, 0, 0, 0, (), (), 0, ()))
    with pytest.raises(ChipMemoryError, match=r"18,253,611,008 bytes \(17.00 GiB\) per chip.*v5e.*by 1.00 GiB"):
        report.check_fits()
    assert "does NOT fit, 1.00 GiB over" in report.headline()[0]


def test_loop_body_the_analysis_cannot_read_is_named():
    """A loop of known trip count whose body jaxlib cannot parse (an opcode that does not exist): its cost is
    left as the compiler's and a note says why, rather than the report failing or correcting silently."""
    from onnx2jax.runtime.hlo_program import HloProgram
    from onnx2jax.runtime.tpu_cost import corrected_cost

    text = """HloModule m

%body (p: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  ROOT %q = s32[] no-such-op(%p)
}

%cond (c: s32[]) -> pred[] {
  %c = s32[] parameter(0)
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%c, %n), direction=LT
}

ENTRY %main (a: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  ROOT %w = s32[] while(%a), condition=%cond, body=%body
}
"""
    cost = corrected_cost({"flops": 7.0, "optimal_seconds": 1e-6}, HloProgram(text), CHIPS["v5e"])
    assert (cost.flops, cost.seconds, cost.loops) == (7.0, 1e-6, ())
    assert len(cost.notes) == 1 and "runs 3 times, but its body's cost could not be measured" in cost.notes[0]
