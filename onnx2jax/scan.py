"""Running a transformer's repeated layers as one ``jax.lax.scan`` over stacked parameters.

Unrolled, an N-layer export is N copies of the layer in the traced program and
XLA compiles all of them: compile time grows with depth. :mod:`onnx2jax.layers`
finds the repeated layer; here the translator runs its first copy once as the
body of a ``lax.scan`` whose carry is the residual stream and whose scanned
input is each layer's parameters, stacked along a new leading axis (once, as
they are placed on the devices, slice by slice: :class:`Stacked`).
Loop-invariant values (masks, rotary tables, shared initializers) are
closed over. The program then holds one layer and a while loop.

Policy (``scan_layers``): ``True`` scans or raises saying why it cannot;
``False`` keeps the unrolled form; ``"auto"`` scans from
:data:`AUTO_MIN_LAYERS` repeated layers on (below that the compile saved is
0.2 s or less, while each loop iteration copies its layer's weights out of the
stacked arrays, up to 46% more per call at width 512 and 1 x 128 tokens;
bench/RESULTS.md, "Repeated layers"), while their parameters stay under
:data:`AUTO_MAX_STACKED_BYTES` (past it, at real widths, that per-call copy
outweighs the compile saved: "Real-size models"), and only layers with
per-layer parameters: a chain of identical parameter-free ops (Relu, Neg,
Relu, Neg, ...) is one fused kernel unrolled and thousands of tiny loop
iterations scanned.
The decision and its reason are in :attr:`ScanPlan.reason`, shown by
``onnx2jax run`` and :meth:`JaxModel.describe_layers`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping, Union

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from onnx2jax.errors import NodeError
from onnx2jax.layers import Repetition, find_repeated_layers
from onnx2jax.loading import host_array
from onnx2jax.placing import place_stacked, stack_on_host

AUTO_MIN_LAYERS = 16
"""``scan_layers="auto"`` scans from this many repeated layers: there the compile saved is seconds (1.4-1.8 s at
32 layers); below it, 0.2 s or less, not worth the per-call weight copy (bench/RESULTS.md, "Repeated layers")."""

AUTO_MAX_STACKED_BYTES = 64 << 20
"""``scan_layers="auto"`` unrolls layers whose parameters pass this many bytes. Each scanned iteration copies its
layer's weights out of the stacked arrays: measured on real widths (bench/RESULTS.md, "Real-size models"), a
24-layer 336M Llama's calls took 0.81 s scanned against 0.48 s unrolled (about 3 GB/s of copies) for 0.9 s less
to the first result; under 64 MiB that copy is some 20 ms a call."""

STACKED_PREFIX = "scan/"
"""Stacked parameters are keyed ``scan/<first layer's initializer name>``."""

ScanSetting = Union[bool, Literal["auto"]]


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """Whether a model's repeated layers run as one ``lax.scan``, and why.

    Attributes:
      active: the layers run as a scan.
      repetition: what :func:`onnx2jax.layers.find_repeated_layers` found.
      reason: one line for the user: what runs how, and why.
    """

    active: bool
    repetition: Repetition
    reason: str

    def stacked_key(self, name: str) -> str:
        return STACKED_PREFIX + name


def plan(
    proto: onnx.ModelProto,
    setting: ScanSetting,
    params: Mapping[str, np.ndarray],
    constants: Mapping[str, np.ndarray],
    *,
    segmented: bool = False,
) -> ScanPlan:
    """Decides whether to scan ``proto``'s repeated layers under ``setting``.

    Raises:
      NodeError: ``setting`` is True and the layers cannot be scanned (the reason says why).
    """
    if setting not in (True, False, "auto"):
        raise ValueError(f"scan_layers must be True, False or 'auto', got {setting!r}")
    if setting is False:
        return ScanPlan(False, Repetition(reason="scan_layers=False"), "layers unrolled: scan_layers=False")
    if segmented:
        return _refuse(setting, Repetition(reason="segmented"), "the model runs in segments around data-dependent nodes")
    repetition = find_repeated_layers(proto.graph, constants.get)  # parameters by structure, never by value
    if not repetition.found:
        return _refuse(setting, repetition, f"no repeated layer: {repetition.reason}")
    traced_constants = [n for n in repetition.stacked if n not in params]
    if traced_constants:
        return _refuse(
            setting, repetition,
            f"{repetition.count} repeated layers found, but initializer {traced_constants[0]!r} differs between "
            "layers and is a compile-time constant (it sets a shape), which a scan cannot stack",
        )
    if setting == "auto" and not repetition.stacked:
        return ScanPlan(
            False, repetition,
            f"layers unrolled: {repetition.count} repeated blocks of {repetition.length} nodes hold no per-layer "
            "parameters (a chain of identical ops, which XLA fuses better unrolled; pass scan_layers=True to force)",
        )
    if setting == "auto" and repetition.count < AUTO_MIN_LAYERS:
        return ScanPlan(
            False, repetition,
            f"layers unrolled: {repetition.count} repeated layers of {repetition.length} nodes, "
            f"fewer than {AUTO_MIN_LAYERS} (scan_layers='auto' scans from {AUTO_MIN_LAYERS}; pass scan_layers=True to force)",
        )
    stacked_bytes = sum(int(np.asarray(params[n]).nbytes) for names in repetition.stacked.values() for n in names)
    if setting == "auto" and stacked_bytes > AUTO_MAX_STACKED_BYTES:
        return ScanPlan(
            False, repetition,
            f"layers unrolled: {repetition.count} repeated layers hold {stacked_bytes / 2**20:,.0f} MiB of parameters, "
            f"more than {AUTO_MAX_STACKED_BYTES // 2**20} MiB: a scan would copy each layer's out of the stack on every "
            "call (+70% per call on a 336M Llama) to save about a second of compile (pass scan_layers=True to force)",
        )
    return ScanPlan(
        True, repetition,
        f"{repetition.count} repeated layers of {repetition.length} nodes run as one lax.scan "
        f"({len(repetition.stacked)} parameters stacked per layer, carrying {list(repetition.carry_in)})",
    )


def _refuse(setting: ScanSetting, repetition: Repetition, why: str) -> ScanPlan:
    if setting is True:
        raise NodeError(f"scan_layers=True: cannot run the layers as a scan: {why}")
    return ScanPlan(False, repetition, f"layers unrolled: {why}")


@dataclasses.dataclass(frozen=True)
class Stacked:
    """One stacked slot: its per-layer parameters, stacked only as each device's slice is placed.

    Stacking on the host (``np.stack``) would hold every layer's weights twice
    (the per-layer arrays, or their file pages, and the stack) until placed;
    :meth:`place` builds each device's slice of the stack from the layers'
    slices instead (:func:`onnx2jax.placing.place_stacked`).
    """

    layers: tuple[np.ndarray, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.layers), *self.layers[0].shape)

    @property
    def dtype(self) -> np.dtype:
        return self.layers[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(int(layer.nbytes) for layer in self.layers)

    def place(self, sharding: jax.sharding.Sharding) -> jax.Array:
        """The stacked array on ``sharding`` (the layer axis first, unsplit)."""
        return place_stacked([host_array(layer) for layer in self.layers], sharding)

    def host(self) -> np.ndarray:
        """The whole stack as one aligned read-only host array, the layers' file pages dropped.

        For an unsharded model's uncommitted arguments: jax on CPU holds it
        without copying, so it is the one copy of these weights.
        """
        return stack_on_host([host_array(layer) for layer in self.layers])


def stacked_arrays(plan_: ScanPlan, params: Mapping[str, np.ndarray]) -> dict[str, Stacked]:
    """Each stacked slot's per-layer parameters, to be stacked along a new leading axis as they are placed."""
    return {
        plan_.stacked_key(first): Stacked(tuple(params[n] for n in names))
        for first, names in plan_.repetition.stacked.items()
    }


def per_layer_names(plan_: ScanPlan) -> set[str]:
    """The initializers the scan reads through their stacked copies instead."""
    return {n for names in plan_.repetition.stacked.values() for n in names}


RunNodes = Callable[[list[onnx.NodeProto], dict[str, Any]], None]


def run(plan_: ScanPlan, graph: onnx.GraphProto, run_nodes: RunNodes, env: dict[str, Any], *, strict: bool) -> str:
    """Runs ``graph``'s nodes over ``env`` (updated in place): prefix, the layers as a scan, suffix.

    ``env`` holds the graph inputs, constants and parameters; a stacked slot
    is read from ``env["scan/<name>"]`` when present (the loaded model's
    copy), else stacked here from the per-layer parameters (a caller's own
    ``params``, differentiable).

    Returns:
      '' when the layers ran as a scan; otherwise (not ``strict``) why they
      ran unrolled instead: a layer's carried tensors change shape or dtype.

    Raises:
      NodeError: ``strict`` and the carried tensors change shape or dtype.
    """
    rep = plan_.repetition
    nodes = graph.node
    run_nodes([nodes[i] for i in rep.prefix_nodes()], env)
    slots = list(rep.stacked)
    body_nodes = [nodes[i] for i in rep.layer_nodes(0)]
    outer = dict(env)

    def body(carry: tuple, layer_params: tuple) -> tuple[tuple, None]:
        local = dict(outer)
        local.update(zip(slots, layer_params))
        local.update(zip(rep.carry_in, carry))
        run_nodes(body_nodes, local)
        return tuple(jnp.asarray(local[n]) for n in rep.carry_out), None

    init = tuple(jnp.asarray(env[n]) for n in rep.carry_in)
    try:
        xs = tuple(
            env[plan_.stacked_key(s)] if plan_.stacked_key(s) in env else jnp.stack([env[n] for n in rep.stacked[s]])
            for s in slots
        )
        final, _ = jax.lax.scan(body, init, xs, length=rep.count)
        note = ""
    except TypeError as err:  # lax.scan: the carry's output type differs from its input type
        why = (
            f"a layer's output differs in shape or dtype from its input (carrying {list(rep.carry_in)}), "
            f"so the {rep.count} layers cannot run as a scan: {err}"
        )
        if strict:
            raise NodeError(f"scan_layers=True: cannot run the layers as a scan: {why}") from err
        note = f"layers unrolled: {why}"
        for s in slots:  # the unrolled layers read their own parameters, which only the stacked copy holds
            key = plan_.stacked_key(s)
            if key in env:
                env.update({n: env[key][k] for k, n in enumerate(rep.stacked[s]) if n not in env})
        for k in range(rep.count):
            run_nodes([nodes[i] for i in rep.layer_nodes(k)], env)
        final = tuple(env[n] for n in rep.outputs)
    env.update(zip(rep.outputs, final))
    run_nodes([nodes[i] for i in rep.suffix_nodes()], env)
    return note
