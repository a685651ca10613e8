"""Control flow: If -> lax.cond, Loop -> lax.scan/lax.while_loop, Scan -> lax.scan.

Subgraphs run through ``ctx.run_graph(graph, inputs)``, which binds the
graph's formal inputs and keeps the outer scope's names visible. Values known
while tracing (numpy) stay static inside a body, so shape chains still fold.

What needs a static decision:

* ``If`` with a static condition runs only the chosen branch at trace time (the
  branches may then differ in shape or even be sequences); a traced condition
  becomes ``lax.cond``, whose branches must agree in structure, shape and dtype.
* ``Loop`` whose trip count is known while tracing (static ``M``, and a
  condition that is static or computed only from the iteration number and the
  incoming condition) becomes a ``lax.scan``; if a loop-carried value changes
  shape or is a sequence, the loop is unrolled instead. Any other loop becomes a
  ``lax.while_loop``, which cannot have scan outputs (their length would be
  data-dependent) nor carried values that change shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper

from onnx2jax.errors import BranchShapesDiffer, NodeError
from onnx2jax.ops.registry import register

_UNROLL_LIMIT = 1024
"""Most iterations a Loop is unrolled at trace time (sequence or shape-changing carries)."""

_NEEDS_STATIC = "must be known while tracing"
"""How graph_runner.py words a static-input error; a scanned body that hits it is unrolled instead."""

_STATIC_COND_LIMIT = 10_000
"""Most iterations whose condition is evaluated at trace time to find the trip count."""


def _is_static(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def _to_jax(tree):
    """Static numpy leaves -> jax arrays; lists (sequences) and None (empty optionals) kept."""
    if tree is None:
        return None
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_jax(t) for t in tree)
    return jnp.asarray(tree)


def _scalar(value) -> np.ndarray:
    return np.asarray(value).reshape(())


def _describe(tree) -> str:
    return str(jax.tree_util.tree_map(lambda a: f"{a.dtype}{list(a.shape)}", tree))


class _CarryChanged(Exception):
    """A loop-carried value changed shape or dtype, so lax.scan cannot carry it."""


def _same_carry(new, old) -> list:
    """``new`` carried values checked against ``old`` (same shapes and dtypes), as jax arrays."""
    out = []
    for n, o in zip(new, old):
        if isinstance(n, (list, type(None))) or isinstance(o, (list, type(None))):
            raise _CarryChanged
        n = jnp.asarray(n)
        if n.shape != o.shape or n.dtype != o.dtype:
            raise _CarryChanged
        out.append(n)
    return out


# --------------------------------------------------------------------------- If


@register("If", 1, 11, 13, 16, 19, 21, 23, 24, 25, context=True)
def if_(ctx, cond, *, then_branch, else_branch):
    if _is_static(cond):
        return tuple(ctx.run_graph(then_branch if bool(_scalar(cond)) else else_branch, []))

    def branch(graph):
        return lambda: tuple(_to_jax(ctx.run_graph(graph, [])))

    then_shapes = jax.eval_shape(branch(then_branch))
    else_shapes = jax.eval_shape(branch(else_branch))
    if jax.tree_util.tree_structure(then_shapes) != jax.tree_util.tree_structure(else_shapes) or any(
        (a.shape, a.dtype) != (b.shape, b.dtype)
        for a, b in zip(jax.tree_util.tree_leaves(then_shapes), jax.tree_util.tree_leaves(else_shapes))
    ):
        raise BranchShapesDiffer(
            "the condition is only known at run time, so both branches must produce the same "
            f"structure, shapes and dtypes; then_branch gives {_describe(then_shapes)}, "
            f"else_branch gives {_describe(else_shapes)}"
        )
    return jax.lax.cond(jnp.reshape(cond, ()).astype(bool), branch(then_branch), branch(else_branch))


# ------------------------------------------------------------------------- Loop


def _cond_slice(body: onnx.GraphProto) -> tuple[onnx.GraphProto, set[str]] | None:
    """The nodes of ``body`` that compute its condition output, as a graph over (iter, cond).

    Returns None when the condition depends on a loop-carried value; otherwise the
    slice and the set of body inputs it reads.
    """
    target = body.output[0].name
    producers = {}
    for node in body.node:
        for name in node.output:
            producers[name] = node
    needed, stack, used_inputs = [], [target], set()
    seen = set()
    formal = [i.name for i in body.input]
    carried = set(formal[2:])
    while stack:
        name = stack.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        if name in carried:
            return None
        if name in formal:
            used_inputs.add(name)
            continue
        node = producers.get(name)
        if node is None:
            continue  # an initializer or an outer-scope name
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None  # nested subgraphs may read carried values implicitly
        needed.append(node)
        stack.extend(node.input)
    order = {id(n): i for i, n in enumerate(body.node)}
    nodes = sorted({id(n): n for n in needed}.values(), key=lambda n: order[id(n)])
    graph = onnx.helper.make_graph(
        nodes, body.name + "_cond", list(body.input[:2]), [body.output[0]], list(body.initializer)
    )
    return graph, used_inputs


def _static_trip_count(ctx, body, m, cond) -> int | None:
    """The number of iterations if it is known while tracing, else None."""
    if (m is not None and not _is_static(m)) or (cond is not None and not _is_static(cond)):
        return None
    limit = None if m is None else int(_scalar(m))
    going = True if cond is None else bool(_scalar(cond))
    if not going or limit == 0:
        return 0
    sliced = _cond_slice(body)
    if sliced is None:
        return None
    graph, used = sliced
    iter_name = body.input[0].name

    def cond_after(i: int, c: bool):
        (out,) = ctx.run_graph(graph, [np.array(i, np.int64), np.array(c)])
        return bool(_scalar(out)) if _is_static(out) else None

    if iter_name not in used:
        stays = cond_after(0, True)
        if stays is None:
            return None
        if stays and limit is None:
            raise ValueError("the loop has no trip count and its condition never becomes false")
        return limit if stays else 1
    i = 0
    while going and (limit is None or i < limit):
        if i >= _STATIC_COND_LIMIT:
            return None
        going = cond_after(i, going)
        if going is None:
            return None
        i += 1
    return i


def _loop_unrolled(ctx, body, trip, initial, n_scan):
    carried = list(initial)
    scans = [[] for _ in range(n_scan)]
    for i in range(trip):
        outs = ctx.run_graph(body, [np.array(i, np.int64), np.array(True), *carried])
        carried = list(outs[1 : 1 + len(carried)])
        for acc, value in zip(scans, outs[1 + len(carried) :]):
            acc.append(value)
    if trip == 0 and n_scan:
        shapes = jax.eval_shape(
            lambda c: ctx.run_graph(body, [np.array(0, np.int64), np.array(True), *c])[1 + len(c) :],
            _to_jax(list(initial)),
        )
        stacked = [jnp.zeros((0, *s.shape), s.dtype) for s in shapes]
    else:
        stacked = [jnp.stack([jnp.asarray(v) for v in acc]) for acc in scans]
    return (*carried, *stacked)


def _loop_scan(ctx, body, trip, initial, n_scan):
    init = [jnp.asarray(v) for v in initial]

    def step(carry, i):
        outs = ctx.run_graph(body, [i, np.array(True), *carry])
        new = _same_carry(outs[1 : 1 + len(carry)], carry)
        return new, [jnp.asarray(v) for v in outs[1 + len(carry) :]]

    final, ys = jax.lax.scan(step, init, jnp.arange(trip, dtype=jnp.int64))
    return (*final, *ys)


def _loop_while(ctx, body, m, cond, initial):
    init = [jnp.asarray(v) for v in initial]
    start_cond = jnp.asarray(True) if cond is None else jnp.reshape(jnp.asarray(cond), ()).astype(bool)
    limit = None if m is None else jnp.reshape(jnp.asarray(m), ()).astype(jnp.int64)

    def keep_going(state):
        i, c, _ = state
        return c if limit is None else jnp.logical_and(c, i < limit)

    def step(state):
        i, c, carry = state
        outs = ctx.run_graph(body, [i, c, *carry])
        try:
            new = _same_carry(outs[1 : 1 + len(carry)], carry)
        except _CarryChanged:
            raise ValueError(
                "the trip count is only known at run time (lax.while_loop), so loop-carried values "
                f"must keep their shape and dtype; they enter as {_describe(list(carry))} and "
                f"leave as {_describe(_to_jax(list(outs[1:1 + len(carry)])))}"
            ) from None
        return i + 1, jnp.reshape(jnp.asarray(outs[0]), ()).astype(bool), new

    _, _, final = jax.lax.while_loop(keep_going, step, (jnp.asarray(0, jnp.int64), start_cond, init))
    return tuple(final)


@register("Loop", 1, 11, 13, 16, 19, 21, 23, 24, 25, context=True)
def loop(ctx, m, cond, *initial, body):
    n_scan = len(body.output) - 1 - len(initial)
    trip = _static_trip_count(ctx, body, m, cond)
    if trip is not None:
        if any(isinstance(v, (list, type(None))) for v in initial) or trip == 0:
            if trip > _UNROLL_LIMIT:
                raise ValueError(
                    f"the loop carries sequences or optionals, so it is unrolled, but its {trip} "
                    f"iterations exceed the unroll limit of {_UNROLL_LIMIT}"
                )
            return _loop_unrolled(ctx, body, trip, initial, n_scan)
        try:
            return _loop_scan(ctx, body, trip, initial, n_scan)
        except (_CarryChanged, NodeError) as e:
            if isinstance(e, NodeError) and _NEEDS_STATIC not in str(e):
                raise
            why = (
                "a loop-carried value changes shape across iterations"
                if isinstance(e, _CarryChanged)
                else "the body uses the iteration number where a value must be known while tracing"
            )
            if trip > _UNROLL_LIMIT:
                raise ValueError(
                    f"{why}, so the loop must be unrolled, but its {trip} iterations exceed the "
                    f"unroll limit of {_UNROLL_LIMIT}"
                ) from e
            return _loop_unrolled(ctx, body, trip, initial, n_scan)
    if n_scan:
        raise ValueError(
            f"the loop has {n_scan} scan output(s) but its trip count is only known at run time "
            "(M or the condition depend on runtime data), so their length would be data-dependent; "
            "make M and the condition constants (or computed from constants and the iteration number)"
        )
    if any(isinstance(v, (list, type(None))) for v in initial):
        raise ValueError(
            "the loop carries sequences or optionals, which needs a trip count known while tracing, "
            "but M or the condition depend on runtime data"
        )
    return _loop_while(ctx, body, m, cond, initial)


# ------------------------------------------------------------------------- Scan


def _reverse_prefix(x, length):
    """Reverses the first ``length`` entries of axis 0 and keeps the rest: [a b c d], 3 -> [c b a d]."""
    t = jnp.arange(x.shape[0])
    return jnp.take(x, jnp.where(t < length, length - 1 - t, t), axis=0)


def _scan_unbatched(ctx, body, states, xs, in_axes, in_dirs, out_axes, out_dirs, length=None):
    """ONNX Scan-9 semantics over already-bound tensors.

    With a (traced) ``length``, only the first ``length`` steps run: later steps keep the
    state and give zero scan outputs, and reversed inputs read their first ``length``
    entries backwards (Scan-8's sequence_lens).
    """
    prepared = []
    for x, axis, direction in zip(xs, in_axes, in_dirs):
        x = jnp.moveaxis(jnp.asarray(x), axis, 0)
        if direction:
            x = jnp.flip(x, 0) if length is None else _reverse_prefix(x, length)
        prepared.append(x)
    init = [jnp.asarray(s) for s in states]
    steps = prepared[0].shape[0] if prepared else 0

    def step(carry, inputs):
        t, slices = inputs
        outs = ctx.run_graph(body, [*carry, *slices])
        try:
            new = _same_carry(outs[: len(carry)], carry)
        except _CarryChanged:
            raise ValueError(
                f"Scan state variables must keep their shape and dtype; they enter as {_describe(list(carry))} "
                f"and leave as {_describe(_to_jax(list(outs[:len(carry)])))}"
            ) from None
        ys = [jnp.asarray(v) for v in outs[len(carry) :]]
        if length is not None:
            live = t < length
            new = [jnp.where(live, n, c) for n, c in zip(new, carry)]
            ys = [jnp.where(live, y, jnp.zeros_like(y)) for y in ys]
        return new, ys

    final, ys = jax.lax.scan(step, init, (jnp.arange(steps), prepared))
    results = []
    for y, axis, direction in zip(ys, out_axes, out_dirs):
        if direction:
            y = jnp.flip(y, 0)
        results.append(jnp.moveaxis(y, 0, axis))
    return (*final, *results)


def _norm_axes(axes, ranks, count):
    axes = list(axes) if axes is not None else [0] * count
    return [int(a) + r if int(a) < 0 else int(a) for a, r in zip(axes, ranks)]


@register("Scan", 9, 11, 16, 19, 21, 23, 24, 25, context=True)
def scan(
    ctx,
    *inputs,
    body,
    num_scan_inputs,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    n_state = len(inputs) - num_scan_inputs
    states, xs = inputs[:n_state], inputs[n_state:]
    n_out = len(body.output) - n_state
    in_axes = _norm_axes(scan_input_axes, [np.ndim(x) for x in xs], len(xs))
    in_dirs = list(scan_input_directions) if scan_input_directions is not None else [0] * len(xs)
    out_dirs = list(scan_output_directions) if scan_output_directions is not None else [0] * n_out
    if scan_output_axes is None:
        out_axes = [0] * n_out
    else:
        shapes = jax.eval_shape(
            lambda s, x: [jnp.asarray(v) for v in ctx.run_graph(body, [*s, *x])[n_state:]],
            _to_jax(list(states)),
            [jnp.take(jnp.asarray(x), 0, axis=a) for x, a in zip(xs, in_axes)],
        )
        out_axes = _norm_axes(scan_output_axes, [len(s.shape) + 1 for s in shapes], n_out)
    return _scan_unbatched(ctx, body, states, xs, in_axes, in_dirs, out_axes, out_dirs)


@register("Scan", 8, context=True)
def scan_8(ctx, sequence_lens, *inputs, body, num_scan_inputs, directions=None):
    n_state = len(inputs) - num_scan_inputs
    states, xs = inputs[:n_state], inputs[n_state:]
    n_out = len(body.output) - n_state
    in_dirs = list(directions) if directions is not None else [0] * len(xs)
    states, xs = [jnp.asarray(s) for s in states], [jnp.asarray(x) for x in xs]

    def one(states_b, xs_b, length=None):
        zeros = [0] * len(xs_b)
        return _scan_unbatched(ctx, body, states_b, xs_b, zeros, in_dirs, [0] * n_out, [0] * n_out, length)

    # Batch axis 0 of every input is vmapped; the body sees unbatched tensors.
    if sequence_lens is None:
        return tuple(jax.vmap(one)(states, xs))
    return tuple(jax.vmap(one)(states, xs, jnp.asarray(sequence_lens).astype(jnp.int32)))
