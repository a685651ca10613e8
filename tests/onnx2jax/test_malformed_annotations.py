"""Malformed annotations, generated one fault at a time, are refused by name by check, the CLI and compile.

Each case starts from valid Megatron-style annotations (a small MLP, or
tests/data/tiny_llama.onnx annotated by `sharding.megatron.megatron_plan`)
and breaks them in exactly one way. The case says what a refusal must name:
the diagnostic code, the node, and the tensor and axis where they apply.

`outcomes` runs one case through `sharding.check`, the CLI ``onnx2jax check
--json`` and `onnx2jax.compile`, and says for each how it ended:
``refused by name``, ``refused, not by name``, ``ran`` or ``crashed: <Error>``.
The CI test runs a few dozen cases, the ``slow`` one thousands; ``python
tests/onnx2jax/test_malformed_annotations.py 2000`` counts the outcomes of a
2,000-case run per fault (run it from the repository root).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as seed_
from hypothesis import strategies as st

import onnx2jax
from onnx2jax.cli.app import main as cli_main
from onnx2jax.errors import ModelLoadError
from sharding import check
from sharding.diagnostics import ShardingError
from sharding.shapes import tensor_shapes
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"
REFUSED = "refused by name"


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a refusal must name. ``at_call``: a size only a call's shapes contradict."""

    fault: str
    code: str
    node: str
    tensor: str | None = None
    axis: int | None = None
    at_call: dict | None = None  # input shapes of the contradicting call

    def names(self, d) -> bool:
        return (
            d.code == self.code
            and d.node == self.node
            and (self.tensor is None or d.tensor == self.tensor)
            and (self.axis is None or d.axis == self.axis)
        )


# ---------------------------------------------------------------- valid bases


def mlp(num_devices: int, hidden: int, order: tuple[int, ...]) -> onnx.ModelProto:
    """y = gelu(x @ w1) @ w2 over ``num_devices`` (in ``order``), Megatron column/row split; x is [B, H]."""
    rng = np.random.default_rng(0)
    w1 = onh.from_array((rng.standard_normal((hidden, 4 * hidden)) * 0.3).astype(np.float32), "w1")
    w2 = onh.from_array((rng.standard_normal((4 * hidden, hidden)) * 0.3).astype(np.float32), "w2")
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        oh.make_node("Gelu", ["h"], ["a"], name="act"),
        oh.make_node("MatMul", ["a", "w2"], ["y"], name="down"),
    ]
    everyone = [onnx.IntIntListEntryProto(key=-1, value=list(order))]

    def split(tensor, axis):
        return onnx.ShardingSpecProto(
            tensor_name=tensor,
            device=list(order),
            sharded_dim=[onnx.ShardedDimProto(axis=axis, simple_sharding=[onnx.SimpleShardedDimProto(num_shards=num_devices)])],
        )

    def replicated(tensor):
        return onnx.ShardingSpecProto(tensor_name=tensor, device=[-1], index_to_device_group_map=everyone)

    for node, specs in (
        (nodes[0], [replicated("x"), split("w1", 1), split("h", 1)]),
        (nodes[2], [split("a", 1), split("w2", 0), replicated("y")]),
    ):
        node.device_configurations.add(configuration_id="tp", sharding_spec=specs)
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", hidden])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", hidden])],
        [w1, w2],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])
    model.configuration.add(name="tp", num_devices=num_devices)
    return model


@functools.cache
def _llama_bytes(num_devices: int) -> bytes:
    return megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), num_devices).SerializeToString()


def llama(num_devices: int) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(_llama_bytes(num_devices))


@st.composite
def bases(draw, llama_share: float = 0.3) -> onnx.ModelProto:
    """A validly annotated model: mostly small MLPs, sometimes the tiny Llama."""
    if draw(st.floats(0, 1)) < llama_share:
        return llama(draw(st.sampled_from([4, 8])))
    n = draw(st.sampled_from([2, 4, 8]))
    order = tuple(draw(st.permutations(range(n))))
    return mlp(n, n * draw(st.sampled_from([1, 2])), order)


# ---------------------------------------------------------------- where to break


@functools.lru_cache(maxsize=8)
def _shapes(serialized: bytes) -> dict:
    return tensor_shapes(onnx.ModelProto.FromString(serialized))[0]


def shapes_of(model: onnx.ModelProto) -> dict:
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for node in stripped.graph.node:
        del node.device_configurations[:]
    return _shapes(stripped.SerializeToString())


def annotated(model):
    return [(i, n) for i, n in enumerate(model.graph.node) if n.device_configurations]


def specs(model, where=lambda node, spec: True):
    """(node index, node, spec) of every spec for which ``where`` holds."""
    return [
        (i, n, s)
        for i, n in annotated(model)
        for c in n.device_configurations
        for s in c.sharding_spec
        if where(n, s)
    ]


def _pick(draw, items):
    assume(items)
    return draw(st.sampled_from(items))


# ---------------------------------------------------------------- the faults, one at a time


def axis_out_of_range(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model, lambda n, s: s.sharded_dim and shapes.get(s.tensor_name) is not None))
    rank = len(shapes[spec.tensor_name])
    dim = draw(st.sampled_from(list(spec.sharded_dim)))
    dim.axis = draw(st.one_of(st.integers(rank, rank + 4), st.integers(-rank - 4, -rank - 1)))
    return Expected("axis out of range", "axis-out-of-range", node.name, spec.tensor_name, dim.axis)


def unknown_configuration(draw, model, shapes):
    i, node = _pick(draw, annotated(model))
    config = draw(st.sampled_from(list(node.device_configurations)))
    config.configuration_id = draw(st.sampled_from(["", "pp", "tp2", "TP", "tp "]))
    return Expected("unknown configuration_id", "unknown-configuration", node.name)


def tensor_not_in_node(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model))
    own = set(node.input) | set(node.output)
    others = sorted({t for n in model.graph.node for t in (*n.input, *n.output) if t and t not in own})
    spec.tensor_name = draw(st.sampled_from(others + ["not_a_tensor"]))
    return Expected("spec on another tensor", "tensor-not-in-node", node.name, spec.tensor_name)


def annotated_twice(draw, model, shapes):
    i, node = _pick(draw, annotated(model))
    copy = node.device_configurations.add()
    copy.CopyFrom(node.device_configurations[0])
    keep = draw(st.integers(0, len(copy.sharding_spec)))
    del copy.sharding_spec[keep:]
    return Expected("node annotated twice", "configuration-repeated", node.name)


def _single_parts(model, shapes):
    return [
        (i, n, s, d)
        for i, n, s in specs(model)
        for d in s.sharded_dim
        if len(d.simple_sharding) == 1
        and shapes.get(s.tensor_name) is not None
        and -len(shapes[s.tensor_name]) <= d.axis < len(shapes[s.tensor_name])
        and isinstance(shapes[s.tensor_name][d.axis], int)
    ]


def dim_value_mismatch(draw, model, shapes):
    i, node, spec, dim = _pick(draw, _single_parts(model, shapes))
    size = shapes[spec.tensor_name][dim.axis]
    dim.simple_sharding[0].dim_value = draw(st.integers(0, 3 * size + 3).filter(lambda v: v != size))
    return Expected("dim_value not the axis size", "dim-value-mismatch", node.name, spec.tensor_name, dim.axis)


def dim_value_on_symbolic_axis(draw, model, shapes):
    """A size written on the symbolic batch axis of the model input, which the call contradicts."""
    graph_input = model.graph.input[0]
    found = specs(model, lambda n, s: s.tensor_name == graph_input.name)
    i, node, spec = _pick(draw, found)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in graph_input.type.tensor_type.shape.dim]
    axis = draw(st.sampled_from([a for a, d in enumerate(dims) if d is None]))
    written = draw(st.integers(1, 9))
    spec.sharded_dim.add(axis=axis, simple_sharding=[onnx.SimpleShardedDimProto(dim_value=written, num_shards=1)])
    call = [d if d is not None else 2 for d in dims]
    call[axis] = draw(st.integers(1, 9).filter(lambda v: v != written))
    return Expected(
        "dim_value on a symbolic axis, contradicted by the call",
        "dim-value-mismatch",
        node.name,
        spec.tensor_name,
        axis,
        at_call={graph_input.name: call},
    )


def node_without_name(draw, model, shapes):
    i, node = _pick(draw, annotated(model))
    op = node.op_type
    node.name = ""
    return Expected("annotated node without a name", "node-name-missing", f"{op}#{i}")


def negative_stage(draw, model, shapes):
    i, node = _pick(draw, annotated(model))
    node.device_configurations[0].pipeline_stage = draw(st.integers(-(2**31), -1))
    return Expected("negative pipeline_stage", "pipeline-stage-invalid", node.name)


def device_out_of_range(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model))
    limit = next(c.num_devices for c in model.configuration)
    bad = draw(st.integers(limit, limit + 100))
    groups = list(spec.index_to_device_group_map)
    if groups and draw(st.booleans()):
        group = draw(st.sampled_from(groups))
        group.value[draw(st.integers(0, len(group.value) - 1))] = bad
    else:
        spec.device[draw(st.integers(0, len(spec.device) - 1))] = bad
    return Expected("device >= num_devices", "device-out-of-range", node.name, spec.tensor_name)


def fused_sizes(draw, model, shapes):
    i, node, spec, dim = _pick(draw, _single_parts(model, shapes))
    size = shapes[spec.tensor_name][dim.axis]
    shards = dim.simple_sharding[0].num_shards
    outer = draw(st.integers(1, 8))
    inner = draw(st.integers(1, 64).filter(lambda v: v * outer != size))
    del dim.simple_sharding[:]
    dim.simple_sharding.add(dim_value=outer, num_shards=1)
    dim.simple_sharding.add(dim_value=inner, num_shards=shards)
    return Expected("fused sizes that do not multiply out", "fused-size-mismatch", node.name, spec.tensor_name, dim.axis)


def device_twice(draw, model, shapes):
    in_lists = specs(model, lambda n, s: sum(d >= 0 for d in s.device) >= 2)
    in_groups = specs(model, lambda n, s: len(s.index_to_device_group_map) > 0)
    i, node, spec = _pick(draw, in_lists + in_groups)
    positions = [k for k, d in enumerate(spec.device) if d >= 0]
    if len(positions) >= 2 and (not spec.index_to_device_group_map or draw(st.booleans())):
        a, b = draw(st.permutations(positions))[:2]
        spec.device[b] = spec.device[a]
    else:
        group = draw(st.sampled_from(list(spec.index_to_device_group_map)))
        group.value.append(draw(st.sampled_from(list(group.value))))
    return Expected("a device listed twice", "device-repeated", node.name, spec.tensor_name)


def shard_count(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model))
    if len(spec.device) > 1 and draw(st.booleans()):
        del spec.device[draw(st.integers(0, len(spec.device) - 1))]
    else:
        spec.device.append(spec.device[0])
    return Expected("device count differs from the shard count", "shard-count-mismatch", node.name, spec.tensor_name)


def axis_twice(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model, lambda n, s: len(s.sharded_dim) > 0))
    first = spec.sharded_dim[0]
    spec.sharded_dim.add(axis=first.axis, simple_sharding=[onnx.SimpleShardedDimProto(num_shards=1)])
    return Expected("one axis sharded twice", "axis-repeated", node.name, spec.tensor_name, first.axis)


def bad_num_shards(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model, lambda n, s: len(s.sharded_dim) > 0))
    dim = draw(st.sampled_from(list(spec.sharded_dim)))
    dim.simple_sharding[0].num_shards = draw(st.integers(-5, 0))
    return Expected("num_shards < 1", "num-shards-invalid", node.name, spec.tensor_name, dim.axis)


def missing_group(draw, model, shapes):
    i, node, spec = _pick(draw, specs(model))
    keys = {e.key for e in spec.index_to_device_group_map}
    spec.device[draw(st.integers(0, len(spec.device) - 1))] = draw(st.integers(-20, -1).filter(lambda k: k not in keys))
    return Expected("device entry naming no group", "group-key-missing", node.name, spec.tensor_name)


FAULTS = {
    f.__name__: f
    for f in (
        axis_out_of_range,
        unknown_configuration,
        tensor_not_in_node,
        annotated_twice,
        dim_value_mismatch,
        dim_value_on_symbolic_axis,
        node_without_name,
        negative_stage,
        device_out_of_range,
        fused_sizes,
        device_twice,
        shard_count,
        axis_twice,
        bad_num_shards,
        missing_group,
    )
}


@st.composite
def malformed(draw, faults=tuple(FAULTS), llama_share: float = 0.3):
    """(model, Expected): a valid base broken in exactly one way."""
    model = draw(bases(llama_share))
    shapes = shapes_of(model)
    fault = draw(st.sampled_from(list(faults)))
    expected = FAULTS[fault](draw, model, shapes)
    return model, expected


# ---------------------------------------------------------------- running a case


def _inputs(model: onnx.ModelProto, shapes: dict | None) -> dict:
    values = {}
    rng = np.random.default_rng(0)
    for info in model.graph.input:
        tensor = info.type.tensor_type
        if shapes and info.name in shapes:
            shape = shapes[info.name]
        else:
            shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        values[info.name] = rng.integers(0, 16, shape).astype(dtype) if dtype.kind in "iu" else rng.standard_normal(shape).astype(dtype)
    return values


def _named(diagnostics, expected: Expected, severity: str) -> bool:
    return any(expected.names(d) and d.severity == severity for d in diagnostics)


def via_check(model, expected: Expected) -> str:
    try:
        diags = check(model, input_shapes=expected.at_call)
    except Exception as e:  # noqa: BLE001 - any escape is what we count
        return f"crashed: {type(e).__name__}"
    if _named(diags, expected, "error"):
        return REFUSED
    return "refused, not by name" if any(d.severity == "error" for d in diags) else "ran"


def via_cli(model, expected: Expected) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        args = ["check", path, "--json"]
        for name, dims in (expected.at_call or {}).items():
            args += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                status = cli_main(args)
        except SystemExit as e:
            status = e.code
        except Exception as e:  # noqa: BLE001
            return f"crashed: {type(e).__name__}"
    try:
        report = json.loads(out.getvalue())
    except ValueError:
        return f"crashed: no JSON (exit {status})"
    found = any(
        d["code"] == expected.code
        and d["node"] == expected.node
        and d["severity"] == "error"  # one verdict: what compile refuses, check calls an error
        and (expected.tensor is None or d["tensor"] == expected.tensor)
        and (expected.axis is None or d["axis"] == expected.axis)
        for d in report["diagnostics"]
    )
    if found and status == 1:
        return REFUSED
    return "refused, not by name" if status == 1 else "ran"


def via_compile(model, expected: Expected) -> str:
    try:
        compiled = onnx2jax.compile(model)
        compiled(**_inputs(model, expected.at_call))
    except ShardingError as e:
        return REFUSED if _named(e.diagnostics, expected, "error") else "refused, not by name"
    except Exception as e:  # noqa: BLE001
        return f"crashed: {type(e).__name__}"
    return "ran"


def outcomes(model, expected: Expected) -> dict[str, str]:
    """How `sharding.check`, ``onnx2jax check`` and `onnx2jax.compile` end on one case."""
    return {"check": via_check(model, expected), "cli": via_cli(model, expected), "compile": via_compile(model, expected)}


# ---------------------------------------------------------------- tests

CI = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SLOW = settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))


def assert_refused_by_name(model, expected: Expected) -> None:
    got = outcomes(model, expected)
    assert got == {"check": REFUSED, "cli": REFUSED, "compile": REFUSED}, (expected, got)


@CI
@given(malformed(llama_share=0.15))
def test_malformed_annotations_are_refused_by_name(case):
    assert_refused_by_name(*case)


@pytest.mark.slow
@SLOW
@given(malformed())
def test_malformed_annotations_are_refused_by_name_many(case):
    assert_refused_by_name(*case)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_fault_on_the_tiny_llama(fault):
    """Each class once on the Megatron-annotated tiny Llama (the generator's other base)."""

    @settings(max_examples=1, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(malformed(faults=(fault,), llama_share=1.0))
    def one(case):
        assert_refused_by_name(*case)

    one()


def _spec(model, node, tensor):
    found = next(n for n in model.graph.node if n.name == node)
    return next(s for s in found.device_configurations[0].sharding_spec if s.tensor_name == tensor)


def _break(fault: str) -> tuple[onnx.ModelProto, Expected]:
    """The issue's classes, each once on the 8-device MLP; the comment says what happened before."""
    model = mlp(8, 8, tuple(range(8)))
    up, down = model.graph.node[0], model.graph.node[2]
    w1 = _spec(model, "up", "w1")
    if fault == "axis out of range":  # was taken modulo the rank, and ran
        w1.sharded_dim[0].axis = 3
        return model, Expected(fault, "axis-out-of-range", "up", "w1", 3)
    if fault == "unknown configuration_id":  # was ignored
        down.device_configurations[0].configuration_id = "pp"
        return model, Expected(fault, "unknown-configuration", "down")
    if fault == "spec on another tensor":  # was ignored
        _spec(model, "up", "h").tensor_name = "y"
        return model, Expected(fault, "tensor-not-in-node", "up", "y")
    if fault == "node annotated twice":  # the second annotation was ignored
        up.device_configurations.add().CopyFrom(up.device_configurations[0])
        return model, Expected(fault, "configuration-repeated", "up")
    if fault == "dim_value not the axis size":  # was ignored
        w1.sharded_dim[0].simple_sharding[0].dim_value = 99
        return model, Expected(fault, "dim-value-mismatch", "up", "w1", 1)
    if fault == "annotated node without a name":  # was silently not applied
        down.name = ""
        return model, Expected(fault, "node-name-missing", "MatMul#2")
    if fault == "negative pipeline_stage":  # passed everywhere
        up.device_configurations[0].pipeline_stage = -1
        return model, Expected(fault, "pipeline-stage-invalid", "up")
    if fault == "device >= num_devices":  # was a bare numpy reshape error
        w1.device[3] = 8
        return model, Expected(fault, "device-out-of-range", "up", "w1")
    if fault == "fused sizes that do not multiply out":  # was a bare ValueError
        del w1.sharded_dim[0].simple_sharding[:]
        w1.sharded_dim[0].simple_sharding.add(dim_value=2, num_shards=1)
        w1.sharded_dim[0].simple_sharding.add(dim_value=5, num_shards=8)
        return model, Expected(fault, "fused-size-mismatch", "up", "w1", 1)
    if fault == "a device listed twice":  # compile: a bare mesh error or a run
        w1.device[1] = w1.device[0]
        return model, Expected(fault, "device-repeated", "up", "w1")
    if fault == "a device listed twice in a group":  # was not even warned
        _spec(model, "up", "x").index_to_device_group_map[0].value.append(0)
        return model, Expected(fault, "device-repeated", "up", "x")
    raise AssertionError(fault)


ISSUE_CLASSES = [
    "axis out of range",
    "unknown configuration_id",
    "spec on another tensor",
    "node annotated twice",
    "dim_value not the axis size",
    "annotated node without a name",
    "negative pipeline_stage",
    "device >= num_devices",
    "fused sizes that do not multiply out",
    "a device listed twice",
    "a device listed twice in a group",
]


@pytest.mark.parametrize("fault", ISSUE_CLASSES)
def test_each_class_of_the_issue_is_refused_by_name(fault):
    model, expected = _break(fault)
    with pytest.raises(ShardingError) as info:
        onnx2jax.compile(model)
    assert any(expected.names(d) and d.severity == "error" for d in info.value.diagnostics), str(info.value)
    assert f"error[{expected.code}] node '{expected.node}'" in str(info.value)
    assert _named(check(model), expected, "error")  # one verdict, the same code


def test_a_size_on_a_symbolic_axis_is_checked_against_each_call():
    model = mlp(8, 8, tuple(range(8)))
    _spec(model, "up", "x").sharded_dim.add(axis=0, simple_sharding=[onnx.SimpleShardedDimProto(dim_value=4, num_shards=1)])
    assert [d.code for d in check(model) if d.severity != "note"] == []
    [note] = [d for d in check(model) if d.code == "size-unresolved"]
    assert (note.node, note.tensor, note.axis) == ("up", "x", 0)
    compiled = onnx2jax.compile(model)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (want,) = onnx2jax.translate(model)(x)
    np.testing.assert_allclose(np.asarray(compiled(x)[0]), np.asarray(want), rtol=2e-5, atol=2e-5)
    with pytest.raises(ShardingError, match=r"error\[dim-value-mismatch\] node 'up' \(MatMul\), tensor 'x', axis 0: "
                       r"dim_value is 4 but axis 0 has size 3"):
        compiled(x[:3])


def test_explain_reports_the_structural_errors_too(tmp_path, capsys):
    model, expected = _break("axis out of range")
    onnx.save(model, tmp_path / "m.onnx")
    assert cli_main(["explain", str(tmp_path / "m.onnx"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any(d["code"] == "axis-out-of-range" and d["node"] == "up" and d["axis"] == 3 for d in report["diagnostics"])


def test_cli_check_refuses_without_a_traceback(tmp_path):
    import subprocess
    import sys

    model, _ = _break("fused sizes that do not multiply out")
    onnx.save(model, tmp_path / "m.onnx")
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", code, "check", str(tmp_path / "m.onnx")], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2], timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "fused-size-mismatch" in run.stdout and "Traceback" not in run.stdout + run.stderr


def count(examples: int, seed: int = 0) -> dict[str, collections.Counter]:
    """Outcomes of ``examples`` generated cases: per fault, how each of check / cli / compile ended."""
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(malformed())
    @seed_(seed)
    def run(case):
        model, expected = case
        for path, outcome in outcomes(model, expected).items():
            tally[expected.fault][f"{path}: {outcome}"] += 1
        tally["all"]["cases"] += 1

    run()
    return tally


if __name__ == "__main__":
    import sys
    import time

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    start = time.perf_counter()
    result = count(n)
    cases = result.pop("all")["cases"]
    print(f"{cases} generated cases in {time.perf_counter() - start:.0f}s")
    totals: collections.Counter = collections.Counter()
    for fault, counter in sorted(result.items()):
        print(f"{fault}: {sum(counter.values()) // 3} cases")
        for key, value in sorted(counter.items()):
            print(f"    {key}: {value}")
            totals[key.split(": ", 1)[1]] += value
    print("all paths:", dict(totals))
