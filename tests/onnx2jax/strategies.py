"""Random small graphs with random valid sharding specs, and the check that a sharded run is right or refused by name.

A case is drawn from one integer seed (hypothesis draws the seed; numpy's
generator draws the rest), so that every failure is one seed to replay:
``run_case(random_case(seed))``.

Graphs: a chain of 2-5 ops from elementwise with broadcasting, Where,
MatMul/Gemm, reductions with and without keepdims, Softmax,
LayerNormalization, Reshape, Transpose, Concat, Split, Slice with strides
(negative too), Gather, Expand and Cast, on float32 tensors whose sizes are
drawn from 2-16 (so that some shard counts do not divide them).

Specs: a random mesh over the 8 devices (one of the factorisations of 8 and a
random device permutation) is drawn per case; each spec is, by construction,
a NamedSharding on that mesh: tensor axes take ordered tuples of mesh axes
(2-D tilings, several mesh axes on one tensor axis), the mesh axes left over
replicate (groups), sometimes one of them is pinned to one coordinate (a spec
on some devices), sometimes an axis is written fused ([2 x 1 shard, n/2 x k
shards]). Specs go on some node outputs, on graph inputs (sharded inputs),
on parameters, and sometimes the input is passed as an already sharded
jax.Array. ``random_case(seed, fused_family=True)`` draws another family,
whose split axes are mostly fused: 2 or 3 sub-axes of any sizes (1s among
them), the mesh axes dealt among them, uneven sub-axes included.

The check (:func:`run_case`): compile and call; the values must equal the
unsharded run and onnxruntime; each output must be placed as its spec (given
or inferred by ``sharding.infer``) says, per device, from
``sharding.tiles.device_regions`` (not from sharding.mesh.layout); outputs warned
"comes back replicated" must be replicated, those warned "comes back split
on axis k" split on axis k, and only those whose spec JAX cannot hold may be
warned; each parameter with a spec is placed as it says.
ShardingError and MeshMappingError are refusals by name; ``sharding.check``
must find an error exactly when compile raises ShardingError (the two agree).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import warnings

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
from jax.sharding import NamedSharding, PartitionSpec

import onnx2jax
import sharding
from sharding.mesh.layout import MeshMappingError
from placement import placement_problem
from sharding.diagnostics import ShardingError
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

FLOAT = onnx.TensorProto.FLOAT
NUM_DEVICES = 8
MESH_SHAPES = ((8,), (2, 4), (4, 2), (2, 2, 2))
SIZES = (2, 3, 4, 6, 8, 12, 16)
FUSED_SIZES = (1, 2, 3, 4, 5, 6, 8, 12)  # the fused family's inputs: axes of 1 and of a prime 5 too


@dataclasses.dataclass
class Case:
    seed: int
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    presharded: dict[str, tuple]  # input -> PartitionSpec entries over the compiled mesh's axes, by position
    description: list[str]


class _Mesh:
    """A random arrangement of the 8 devices as a mesh: ``array[coords]`` is a device.

    With ``fused_family`` its specs write most split axes fused (:meth:`_fused_family_spec`).
    """

    def __init__(self, rng: np.random.Generator, fused_family: bool = False):
        shape = MESH_SHAPES[rng.integers(len(MESH_SHAPES))]
        self.array = rng.permutation(NUM_DEVICES).reshape(shape)
        self.fused_family = fused_family

    def spec(self, rng: np.random.Generator, name: str, shape: tuple[int, ...], *, allow_fused: bool = True) -> ShardingSpec:
        """A random spec on ``shape`` that is a NamedSharding on this mesh (of its unfused view, when fused)."""
        if self.fused_family:
            return self._fused_family_spec(rng, name, shape)
        free = list(rng.permutation(self.array.ndim))
        axes = [int(a) for a in rng.permutation(len(shape))]
        dims: list[tuple[int, tuple[int, ...], bool]] = []  # (tensor axis, mesh axes, fused)
        for axis in axes:
            if not free or rng.random() < 0.4:
                continue
            take = int(rng.integers(1, len(free) + 1))
            chosen = tuple(int(a) for a in free[:take])
            count = math.prod(self.array.shape[a] for a in chosen)
            if count > shape[axis]:  # more shards than elements: keep it rare
                if rng.random() < 0.8:
                    continue
            fused = allow_fused and shape[axis] % 2 == 0 and shape[axis] >= 4 and rng.random() < 0.15
            if fused and (shape[axis] // 2) % count:
                fused = False
            del free[:take]
            dims.append((axis, chosen, fused))
        pinned = {}
        if free and rng.random() < 0.15:  # a spec on some devices only
            a = int(free.pop())
            pinned[a] = int(rng.integers(self.array.shape[a]))
        sharded = []
        for axis, chosen, fused in dims:
            count = math.prod(self.array.shape[a] for a in chosen)
            if fused:
                parts = (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(count, dim_value=shape[axis] // 2))
            else:
                parts = (SimpleShardedDim(count),)
            sharded.append(ShardedDim(axis, parts))
        return self._written(name, sharded, [chosen for _, chosen, _ in dims], pinned)

    def _fused_family_spec(self, rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> ShardingSpec:
        """A random spec whose split axes are mostly fused: several simple_shardings on one axis.

        A fused axis is written as 2 or 3 sub-axes whose sizes multiply to the axis (sizes 1 among them), and
        the mesh axes it takes are dealt, in order, to its sub-axes (some get none: 1 shard; several on one:
        a 2-D cut of it). Sub-axes need not divide (a size-1 sub-axis cut 4 ways: issue 40's crashes). The
        mesh axes left over replicate (device groups), sometimes one is pinned (a spec on some devices).
        """
        free = list(rng.permutation(self.array.ndim))
        sharded, grid = [], []
        for axis in (int(a) for a in rng.permutation(len(shape))):
            if not free or rng.random() < 0.3:
                continue
            take = int(rng.integers(1, len(free) + 1))
            chosen = tuple(int(a) for a in free[:take])
            del free[:take]
            if rng.random() < 0.3:  # a plain split beside the fused ones
                sharded.append(ShardedDim(axis, (SimpleShardedDim(self._count(chosen)),)))
                grid.append(chosen)
                continue
            subs = _factorisation(rng, shape[axis])
            cuts = sorted(int(c) for c in rng.integers(0, take + 1, size=len(subs) - 1))
            dealt = [chosen[a:b] for a, b in zip([0, *cuts], [*cuts, take])]
            sharded.append(ShardedDim(axis, tuple(SimpleShardedDim(self._count(d), dim_value=n) for n, d in zip(subs, dealt))))
            grid.extend(dealt)
        pinned = {}
        if free and rng.random() < 0.2:
            a = int(free.pop())
            pinned[a] = int(rng.integers(self.array.shape[a]))
        return self._written(name, sharded, grid, pinned)

    def _count(self, mesh_axes: tuple[int, ...]) -> int:
        return math.prod(self.array.shape[a] for a in mesh_axes)

    def _written(self, name: str, sharded: list, mesh_axes: list[tuple[int, ...]], pinned: dict[int, int]) -> ShardingSpec:
        """The spec cutting each shard-grid axis (row-major, as written) over ``mesh_axes`` of it: each shard's
        devices are the mesh block at its coordinates (a group when several; ``pinned`` axes fixed)."""
        devices, groups = [], []
        for index in itertools.product(*[range(math.prod(self.array.shape[a] for a in ch)) for ch in mesh_axes]):
            coords: list = [slice(None)] * self.array.ndim
            for a, c in pinned.items():
                coords[a] = c
            for chosen, i in zip(mesh_axes, index):
                digits = np.unravel_index(i, [self.array.shape[a] for a in chosen])
                for a, d in zip(chosen, digits):
                    coords[a] = int(d)
            block = sorted(int(d) for d in np.ravel(self.array[tuple(coords)]))
            if len(block) == 1:
                devices.append(block[0])
            else:
                key = -len(groups) - 1
                groups.append((key, tuple(block)))
                devices.append(key)
        return ShardingSpec(name, tuple(sharded), tuple(devices), tuple(groups))


class _Graph:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.specs: dict[str, list[ShardingSpec]] = {}
        self.values: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def weight(self, shape) -> str:
        name = self.fresh("p")
        self.inits.append(onh.from_array(self.rng.standard_normal(shape).astype(np.float32), name))
        self.shapes[name] = tuple(shape)
        return name

    def const(self, array) -> str:
        name = self.fresh("c")
        self.inits.append(onh.from_array(np.asarray(array), name))
        return name

    def node(self, op, inputs, outputs, **attrs) -> str:
        name = f"{op.lower()}{len(self.nodes)}"
        self.nodes.append(oh.make_node(op, inputs, outputs, name=name, **attrs))
        return name


def _factorisation(rng: np.random.Generator, size: int) -> tuple[int, ...]:
    """``size`` as 2 or 3 factors in a random order, 1s included (5 -> (1, 5) or (5, 1), 1 -> (1, 1))."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    first = int(rng.choice(divisors))
    rest = size // first
    if rng.random() < 0.3:
        middle = int(rng.choice([d for d in range(1, rest + 1) if rest % d == 0]))
        return (first, middle, rest // middle)
    return (first, rest)


def _broadcast_shape(rng, shape):
    keep = int(rng.integers(1, len(shape) + 1))
    return tuple(1 if rng.random() < 0.3 else d for d in shape[len(shape) - keep :])


def _add_op(g: _Graph, rng, current: str, shape: tuple[int, ...], extra_outputs: list) -> tuple[str, tuple[int, ...], str]:
    """Appends one op (or a short idiom) reading ``current``; returns (output, its shape, last node name)."""
    rank = len(shape)
    kind = rng.choice(
        ["unary", "binary", "where", "matmul", "gemm", "reduce", "softmax", "layernorm", "reshape",
         "transpose", "concat", "split", "slice", "gather", "expand", "cast"]
    )
    out = g.fresh("t")
    if kind == "unary":
        name = g.node(str(rng.choice(["Relu", "Tanh", "Neg", "Sigmoid", "Abs"])), [current], [out])
        return out, shape, name
    if kind == "binary":
        w = g.weight(_broadcast_shape(rng, shape))
        operands = [current, w] if rng.random() < 0.7 else [w, current]
        name = g.node(str(rng.choice(["Add", "Mul", "Sub"])), operands, [out])
        return out, shape, name
    if kind == "where":
        cond = g.fresh("cond")
        g.node("Greater", [current, g.const(np.array(0.0, np.float32))], [cond])
        name = g.node("Where", [cond, current, g.weight(_broadcast_shape(rng, shape))], [out])
        return out, shape, name
    if kind == "matmul" or (kind == "gemm" and rank != 2):
        k = int(rng.choice(SIZES))
        name = g.node("MatMul", [current, g.weight((shape[-1], k))], [out])
        return out, shape[:-1] + (k,), name
    if kind == "gemm":
        k = int(rng.choice(SIZES))
        trans = int(rng.integers(2))
        w = g.weight((k, shape[1]) if trans else (shape[1], k))
        name = g.node("Gemm", [current, w, g.weight((k,))], [out], transB=trans, alpha=0.5)
        return out, (shape[0], k), name
    if kind == "reduce":
        axes = sorted(int(a) for a in rng.choice(rank, size=int(rng.integers(1, rank + 1)), replace=False))
        keep = int(rng.integers(2)) if len(axes) < rank else 1
        op = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"]))
        name = g.node(op, [current, g.const(np.array(axes, np.int64))], [out], keepdims=keep)
        new = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else tuple(d for i, d in enumerate(shape) if i not in axes)
        return out, new, name
    if kind == "softmax":
        name = g.node("Softmax", [current], [out], axis=int(rng.integers(-rank, rank)))
        return out, shape, name
    if kind == "layernorm":
        axis = int(rng.integers(0, rank))
        norm = shape[axis:]
        name = g.node("LayerNormalization", [current, g.weight(norm), g.weight(norm)], [out], axis=axis)
        return out, shape, name
    if kind == "reshape":
        splittable = [i for i, d in enumerate(shape) if d % 2 == 0 and d >= 4]
        if rank >= 2 and (rank >= 4 or not splittable or rng.random() < 0.5):
            i = int(rng.integers(rank - 1))
            new = shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2 :]
        elif splittable:
            i = int(rng.choice(splittable))
            new = shape[:i] + (2, shape[i] // 2) + shape[i + 1 :]
        else:
            new = shape
        name = g.node("Reshape", [current, g.const(np.array(new, np.int64))], [out])
        return out, new, name
    if kind == "transpose":
        perm = [int(p) for p in rng.permutation(rank)]
        name = g.node("Transpose", [current], [out], perm=perm)
        return out, tuple(shape[p] for p in perm), name
    if kind == "concat":
        axis = int(rng.integers(rank))
        other = shape[:axis] + (int(rng.choice(SIZES)),) + shape[axis + 1 :]
        name = g.node("Concat", [current, g.weight(other)], [out], axis=axis)
        return out, shape[:axis] + (shape[axis] + other[axis],) + shape[axis + 1 :], name
    if kind == "split":
        axes = [i for i, d in enumerate(shape) if d >= 2]
        if not axes:
            return _add_op(g, rng, current, shape, extra_outputs)
        axis = int(rng.choice(axes))
        first = int(rng.integers(1, shape[axis]))
        rest = g.fresh("rest")
        name = g.node("Split", [current, g.const(np.array([first, shape[axis] - first], np.int64))], [out, rest], axis=axis)
        extra_outputs.append((rest, shape[:axis] + (shape[axis] - first,) + shape[axis + 1 :]))
        return out, shape[:axis] + (first,) + shape[axis + 1 :], name
    if kind == "slice":
        axis = int(rng.integers(rank))
        n = shape[axis]
        step = int(rng.choice([1, 2, 3, 5, -1, -2, -3]))
        start = int(rng.integers(n))
        if step > 0:
            end = int(rng.integers(start + 1, n + 1))
            taken = len(range(start, end, step))
        else:  # down to end + 1, or (end = -n - 1) through index 0
            end = int(rng.integers(-1, start))
            taken = len(range(start, end, step))
            end = -n - 1 if end == -1 else end
        if taken == 0:
            return _add_op(g, rng, current, shape, extra_outputs)
        consts = [np.array([v], np.int64) for v in (start, end, axis, step)]
        name = g.node("Slice", [current, *[g.const(c) for c in consts]], [out])
        return out, shape[:axis] + (taken,) + shape[axis + 1 :], name
    if kind == "gather":
        axis = int(rng.integers(rank))
        n = shape[axis]
        if rng.random() < 0.3 and rank > 1:
            indices = np.array(int(rng.integers(-n, n)), np.int64)
        else:
            indices = rng.integers(-n, n, size=int(rng.integers(1, 5))).astype(np.int64)
        name = g.node("Gather", [current, g.const(indices)], [out], axis=axis)
        return out, shape[:axis] + indices.shape + shape[axis + 1 :], name
    if kind == "expand":
        if rank >= 4:
            return _add_op(g, rng, current, shape, extra_outputs)
        new = (int(rng.choice(SIZES)),) + shape
        name = g.node("Expand", [current, g.const(np.array(new, np.int64))], [out])
        return out, new, name
    wide = g.fresh("dbl")
    g.node("Cast", [current], [wide], to=onnx.TensorProto.DOUBLE)
    name = g.node("Cast", [wide], [out], to=FLOAT)
    return out, shape, name


def random_case(seed: int, *, fused_family: bool = False) -> Case:
    """The case of one seed: a random graph, specs on it, and its inputs.

    Args:
      fused_family: write most split axes fused (several simple_shardings on one axis, sizes 1 and uneven
        among the sub-axes), on inputs whose sizes include 1 and 5; another family of seeds than the default.
    """
    rng = np.random.default_rng(seed)
    mesh = _Mesh(rng, fused_family)
    g = _Graph(rng)
    rank = int(rng.integers(1, 4))
    shape = tuple(int(d) for d in rng.choice(FUSED_SIZES if fused_family else SIZES, size=rank))
    g.inputs.append(oh.make_tensor_value_info("x", FLOAT, list(shape)))
    inputs = {"x": rng.standard_normal(shape).astype(np.float32)}
    description = [f"mesh {mesh.array.tolist()}", f"x {list(shape)}"]
    current, extra = "x", []
    steps = int(rng.integers(2, 6))
    for step in range(steps):
        before = len(g.nodes)
        current, shape, name = _add_op(g, rng, current, shape, extra)
        node = g.nodes[-1]
        specs = []
        if step == 0 and rng.random() < 0.5:  # a sharded graph input
            first = g.nodes[before]
            specs_first = [mesh.spec(rng, "x", tuple(inputs["x"].shape))]
            g.specs.setdefault(first.name, []).extend(specs_first)
        for position, tensor in enumerate(node.input):
            if tensor in g.shapes and rng.random() < 0.3:
                specs.append(mesh.spec(rng, tensor, g.shapes[tensor]))
        if rng.random() < 0.5:
            specs.append(mesh.spec(rng, current, shape))
        if specs:
            g.specs.setdefault(name, []).extend(specs)
        description.append(f"{node.op_type} -> {current} {list(shape)}")
    g.outputs.append(oh.make_tensor_value_info(current, FLOAT, list(shape)))
    for rest, rest_shape in extra:
        g.outputs.append(oh.make_tensor_value_info(rest, FLOAT, list(rest_shape)))
    graph = oh.make_graph(g.nodes, "random", g.inputs, g.outputs, g.inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    model.ir_version = 10
    if g.specs:
        model.configuration.add().CopyFrom(onnx.DeviceConfigurationProto(name="tp", num_devices=NUM_DEVICES))
    for node in model.graph.node:
        specs = g.specs.get(node.name)
        if specs:
            config = node.device_configurations.add()
            config.configuration_id = "tp"
            for spec in specs:
                config.sharding_spec.add().CopyFrom(spec.to_proto())
    presharded = {}
    if rng.random() < 0.3:
        presharded["x"] = tuple(int(rng.integers(0, 1 << 30)) for _ in inputs["x"].shape)
    return Case(seed, model, inputs, presharded, description)


@dataclasses.dataclass
class Outcome:
    kind: str  # "right", "refused", "wrong", "crash", "lying-warning", "misplaced", "disagree"
    detail: str = ""


def _presharded(mesh, value: np.ndarray, draws: tuple) -> jax.Array:
    """``value`` placed on ``mesh`` with an evenly dividing PartitionSpec chosen by ``draws``."""
    free = list(mesh.axis_names)
    entries = []
    for size, draw in zip(value.shape, draws):
        options = [None] + [a for a in free if size % mesh.shape[a] == 0]
        choice = options[draw % len(options)]
        if choice is not None:
            free.remove(choice)
        entries.append(choice)
    return jax.device_put(value, NamedSharding(mesh, PartitionSpec(*entries)))


def _holdable(spec: ShardingSpec, shape: tuple[int, ...]) -> bool:
    """Whether JAX can hold a tensor of ``shape`` sharded as ``spec``: every shard one box, all of one shape.

    Read off ``sharding.tiles.device_regions`` (DESIGN's definition, element by element): a plain split
    that divides, or a fused axis whose shards are even contiguous blocks of it (``[{4, 2}, {2, 1}]`` on 8),
    is; an uneven split, an empty shard (``[{1, 2}, {5, 1}]``: device 1 holds nothing) or a shard in
    several pieces (``[{2, 1}, {4, 2}]``) is not.
    """
    regions = [r for held in sharding.device_regions(spec, shape).values() for r in held]
    if any(len(ranges) != 1 for r in regions for ranges in r.ranges):
        return False
    return len({tuple(stop - start for ((start, stop),) in r.ranges) for r in regions}) == 1


def _is_replicated(array: jax.Array) -> bool:
    return all(tuple(s.data.shape) == tuple(array.shape) for s in array.addressable_shards)


def _split_on(array: jax.Array, axis: int) -> bool:
    """Whether every device holds an even part of ``array``'s ``axis``, less than the whole."""
    return all(s.data.shape[axis] * len({t.index[axis].start for t in array.addressable_shards}) == array.shape[axis]
               and s.data.shape[axis] < array.shape[axis] for s in array.addressable_shards)


def run_case(case: Case, *, unsharded: bool = True) -> Outcome:
    """Compiles and runs ``case``; classifies what happened (see the module docstring).

    Args:
      unsharded: compare with the unsharded run too, not only with onnxruntime
        (which the unsharded run must then match).
    """
    import onnxruntime

    model = case.model
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [np.asarray(o) for o in session.run(None, case.inputs)]
    if unsharded:
        for got, ort in zip(onnx2jax.translate(model)(**case.inputs), want):
            np.testing.assert_allclose(np.asarray(got), ort, rtol=1e-4, atol=1e-4)  # the references agree
    checked = [d for d in sharding.check(model) if d.severity == "error"] if model.configuration else []
    try:
        compiled = onnx2jax.compile(model)
    except ShardingError as e:
        if not checked:
            return Outcome("disagree", f"compile refused what sharding.check accepts: {str(e)[:300]}")
        return Outcome("refused", f"ShardingError: {str(e)[:300]}")
    except MeshMappingError as e:  # the mesh is compile's question, not check's
        return Outcome("refused", f"MeshMappingError: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001 - anything else is a finding
        return Outcome("crash", f"compile: {type(e).__name__}: {str(e)[:500]}")
    if checked:
        return Outcome("disagree", f"compile accepted what sharding.check refuses: {checked[0]}")
    inputs = dict(case.inputs)
    for name, draws in case.presharded.items():
        inputs[name] = _presharded(compiled.mesh, inputs[name], draws)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outputs = compiled(**inputs)
    except (ShardingError, MeshMappingError) as e:
        return Outcome("refused", f"{type(e).__name__} at call: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001
        return Outcome("crash", f"call: {type(e).__name__}: {str(e)[:500]}")
    for name, got, expected in zip([o.name for o in model.graph.output], outputs, want):
        # float32 sums are reordered by sharding: the tolerance scales with the output's magnitude
        # (a sum of 7,168 values up to 735 that cancels to ~1 differs by 1.6e-3; seed 918)
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        if not np.allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4 * max(1.0, scale), equal_nan=True):
            diff = float(np.nanmax(np.abs(np.asarray(got) - expected))) if expected.size else 0.0
            return Outcome("wrong", f"output {name!r}: max |sharded - onnxruntime| {diff:.3g}")
    return _check_placements(case, compiled, outputs, [str(w.message) for w in caught])


def _check_placements(case: Case, compiled, outputs, warned: list[str]) -> Outcome:
    model = case.model
    devices = jax.devices()
    inference = sharding.infer(model, "tp") if model.configuration else None
    produced = {}
    if inference is not None:
        for node in model.graph.node:
            complete = inference.nodes.get(node.name)
            for position, name in enumerate(node.output):
                if complete is not None and position < len(complete.outputs) and complete.outputs[position] is not None:
                    produced[name] = complete.outputs[position]
    for output, array in zip(model.graph.output, outputs):
        name = output.name
        warned_here = [w for w in warned if f"output {name!r}" in w]
        spec = produced.get(name)
        if spec is None:
            if not _is_replicated(array):
                return Outcome("misplaced", f"output {name!r} has no spec but comes back {array.sharding}")
            continue
        if warned_here:
            if _holdable(spec, tuple(array.shape)):
                return Outcome("lying-warning", f"output {name!r} warned although JAX can hold its spec")
            moved = re.search(r"comes back split on axis (\d+) instead", warned_here[0])
            if moved and not _split_on(array, int(moved.group(1))):
                return Outcome("lying-warning", f"output {name!r} warned split on axis {moved.group(1)}, is {array.sharding}")
            if warned_here[0].endswith("comes back replicated") and not _is_replicated(array):
                return Outcome("lying-warning", f"output {name!r} warned replicated, is {array.sharding}")
            continue
        if not _holdable(spec, tuple(array.shape)):
            return Outcome("misplaced", f"output {name!r}: spec JAX cannot hold, and no warning")
        problem = placement_problem(array, spec, devices)
        if problem:
            return Outcome("misplaced", f"output {name!r}: {problem}")
    first_reader = {}
    for node in model.graph.node:
        for position, tensor in enumerate(node.input):
            first_reader.setdefault(tensor, (node, position))
    for name, param in compiled.params.items():
        node, position = first_reader[name]
        written = [
            onnx_spec for config in node.device_configurations for onnx_spec in config.sharding_spec
            if onnx_spec.tensor_name == name
        ]
        if not written:
            continue
        spec = ShardingSpec.from_proto(written[0])
        logical = np.asarray(compiled.logical_params[name])
        expected = onh.to_array(next(i for i in model.graph.initializer if i.name == name))
        if not np.array_equal(logical, expected):
            return Outcome("wrong", f"parameter {name!r} does not hold its initializer")
        if tuple(param.shape) == expected.shape and _holdable(spec, expected.shape):  # held as written, not unfused
            problem = placement_problem(param, spec, devices)
            if problem:
                return Outcome("misplaced", f"parameter {name!r}: {problem}")
    return Outcome("right")
