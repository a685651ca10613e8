"""MatMulNBits (com.microsoft): a MatMul whose weight is packed n-bit blocks, sharded like MatMul.

``Y[..., N] = A[..., K] @ dequantize(B).T`` with ``B`` uint8 ``[N, n_blocks, blob]`` (``n_blocks = ceil(K /
block_size)``, ``blob = block_size * bits / 8``), ``scales`` ``[N, n_blocks]`` or flat ``[N * n_blocks]``,
optional ``zero_points`` (packed uint8 ``[N, ceil(n_blocks * bits / 8)]``, or float like the scales),
``g_idx`` ``[K]`` and ``bias`` ``[N]``. As for MatMul (0007): the batch axes of A broadcast, N shards freely
and passes to the output, K is a reduction:

* **column** (N): ``B``, ``scales``, ``zero_points`` and ``bias`` split on their N axis alike, the output on
  its last axis;
* **row** (K): A's last axis and ``B``'s blocks axis (1) split alike, ``scales``/``zero_points`` on their
  blocks axis; every K shard must hold whole quantisation blocks (a cut inside a block, or inside a packed
  zero-point byte, is an error), and the partial products meet in an all-reduce.

A flat 1-D ``scales``/``zero_points`` is read as its ``[N, n_blocks]`` view: a plain split of it is an N
split; a fused ``[{N, 1}, {n_blocks, w}]`` is a K split. ``B``'s blob axis must stay whole (it is inside a
block). ``g_idx`` (act-order group indices) maps K rows to global blocks, so it stays replicated and K may
not be split when it is given.
"""

from __future__ import annotations

from sharding import codes
from sharding.rules.base import Rule, text
from sharding.rules.contract import Operand, contract
from sharding.rules.matmul import NAMES
from sharding.rules.views import clone_spec, make_dim, resolved_parts, sharded_dims


def _block_view(ctx, spec, n: int, blocks: int, index: int):
    """``spec`` of a flat ``[n * blocks]`` input as a spec of its ``[n, blocks]`` view, or None (reported)."""
    if spec is None or not sharded_dims(spec, 1):
        return None if spec is None else clone_spec(spec.tensor_name, (), spec.devices, spec.groups)
    (_, dim), = sharded_dims(spec, 1)
    parts = [(size, shards) for size, shards in resolved_parts(dim, n * blocks) if size != 1]
    if len(parts) == 1 and n % parts[0][1] == 0:
        dims = (make_dim(0, [(n, parts[0][1])]),)
    elif len(parts) == 2 and parts[0][0] == n and parts[1][0] == blocks:
        dims = tuple(d for d in (make_dim(0, [(n, parts[0][1])]), make_dim(1, [(blocks, parts[1][1])])) if d)
    else:
        ctx.diag(
            codes.QUANTIZED_BLOCK_SPLIT,
            f"{ctx.input_name(index)!r} (flat [{n} * {blocks}]) is cut in a way that is neither by N nor "
            "by K blocks",
            f"split it in a divisor of N={n} (column), or as the fused axis [{{{n}, 1}}, {{{blocks}, w}}] "
            "(row)",
            tensor=ctx.input_name(index),
            axis=0,
            given=text(spec),
            expected="a split by N or by K blocks",
        )
        return False
    return clone_spec(spec.tensor_name, dims, spec.devices, spec.groups)


class MatMulNBits(Rule):
    ops = frozenset({"MatMulNBits"})
    domain = "com.microsoft"

    def outputs(self, ctx, in_specs):
        sa = ctx.in_shapes[0]
        if sa is None:
            ctx.unknown("the rank of A is unknown", tensor=ctx.input_name(0))
            return []
        k, n = int(ctx.attr("K")), int(ctx.attr("N"))
        bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size"))
        blocks = -(-k // block)
        batch = [("b", i) for i in range(len(sa) - 1)]
        operands = [Operand(in_specs[0], [*batch, "k"], sa), Operand(in_specs[1], ["n", "kb", "blob"], ctx.in_shapes[1])]
        for index in (2, 3):  # scales, zero points: [N, blocks'] or flat
            if index >= len(in_specs) or not ctx.input_name(index):
                continue
            spec, shape = in_specs[index], ctx.in_shapes[index]
            if shape is not None and len(shape) == 1:
                per_row = shape[0] // n if isinstance(shape[0], int) else blocks
                spec = _block_view(ctx, spec, n, per_row, index)
                if spec is False:
                    return []
                shape = (n, per_row)
            operands.append(Operand(spec, ["n", "kz" if index == 3 else "kb"], shape))
        if len(in_specs) > 4 and ctx.input_name(4):
            operands.append(Operand(in_specs[4], ["g"], ctx.in_shapes[4]))
        if len(in_specs) > 5 and ctx.input_name(5):
            operands.append(Operand(in_specs[5], ["n"], ctx.in_shapes[5]))
        if not self._blocks_whole(ctx, operands, blocks, bits):
            return []
        # K is one label: A's K elements and the blocks (and zero-point bytes) are cut into the same shards.
        operands = [Operand(o.spec, ["k" if x in ("kb", "kz") else x for x in o.labels], o.shape) for o in operands]
        return contract(ctx, operands, [(ctx.node.output[0], [*batch, "n"])], label_names=NAMES,
                        mismatch_code={"k": codes.K_SHARDING_MISMATCH})

    def _blocks_whole(self, ctx, operands, blocks: int, bits: int) -> bool:
        """Reports K cuts that split a quantisation block, a sharded blob axis and a K split with g_idx."""
        ok = True
        k_cut = False
        for op in operands:
            if op.spec is None:
                continue
            for axis, dim in sharded_dims(op.spec, len(op.labels)):
                label, w = op.labels[axis], dim.num_shards
                name = op.spec.tensor_name
                if label in ("blob", "g"):
                    what = "the bytes of one quantisation block" if label == "blob" else "g_idx"
                    ctx.diag(codes.QUANTIZED_BLOCK_SPLIT, f"{name!r} axis {axis} holds {what}; it cannot be split",
                             f"replicate {name!r} along axis {axis}", tensor=name, axis=axis,
                             given=text(op.spec), expected=f"axis {axis} unsharded")
                    ok = False
                    continue
                size = op.shape[axis] if op.shape is not None else None
                units = {"k": blocks, "kb": blocks, "kz": size}.get(label)
                if label in ("k", "kb", "kz"):
                    k_cut = True
                    if len(dim.parts) > 1 or (isinstance(units, int) and units % w):
                        ctx.diag(codes.QUANTIZED_BLOCK_SPLIT,
                                 f"{name!r} axis {axis} (K) is cut in {w}, which splits a quantisation block "
                                 f"({blocks} blocks of {ctx.attr('block_size')}, {bits} bits)",
                                 f"cut K in a divisor of {blocks} blocks" + (
                                     f" and of the {size} zero-point bytes" if label == "kz" else ""),
                                 tensor=name, axis=axis, given=text(op.spec), expected="whole blocks per shard")
                        ok = False
        if k_cut and len(ctx.node.input) > 4 and ctx.input_name(4):
            ctx.diag(codes.QUANTIZED_BLOCK_SPLIT, "K is split, but g_idx maps K rows to global blocks",
                     "leave K whole (split N instead) when g_idx is given", tensor=ctx.input_name(4),
                     expected="K unsharded")
            ok = False
        return ok


RULES = [MatMulNBits()]
