"""Inferred specs checked element by element against the input specs (tiles geometry).

For a reshape-like op, every device must hold exactly the elements it held
before (the data does not move); for elementwise ops, every device must hold
all the input elements its output elements need.
"""

import numpy as np
import pytest

from sharding.text import parse_spec
from sharding.tiles import device_regions


def held(spec_text, shape):
    """{device: set of flat element indices} under a spec."""
    spec = parse_spec(spec_text, "t")
    result = {}
    for device, regions in device_regions(spec, shape).items():
        flat = set()
        for region in regions:
            idx = np.ix_(*region.indices()) if shape else ()
            flat |= set(np.arange(int(np.prod(shape))).reshape(shape)[idx].ravel().tolist())
        result[device] = flat
    return result


@pytest.mark.parametrize(
    "in_shape, spec, out_shape",
    [
        ((2, 4, 64), "2:8 @ [0,1,2,3,4,5,6,7]", (2, 4, 8, 8)),
        ((2, 4, 8, 8), "2:4 @ [0,1,2,3]", (2, 4, 64)),
        ((64,), "0:8 @ [0,1,2,3,4,5,6,7]", (4, 16)),
        ((2, 4), "1:2,0:2 @ [0,1,2,3]", (8,)),
        ((2, 64), "1:2 @ [0,1]", (128,)),
        ((4, 2, 3, 8), "0:4 @ [0,1,2,3]", (4, 2, 2, 3, 4)),
        ((6, 8), "0:(3x1,2x2),1:2 @ [0,1,2,3]", (3, 2, 8)),
        ((2, 192), "1:(3x1,64x8) @ [0,1,2,3,4,5,6,7]", (2, 3, 64)),
        ((8, 6), "0:2 @ [{0,1},{2,3}]", (2, 4, 6)),
        ((2, 3, 4), "0:2 @ [0,1]", (4, 2, 3)),
        ((3, 4, 2), "0:3 @ [0,1,2]", (6, 4)),
    ],
)
def test_reshape_moves_no_data(g, in_shape, spec, out_shape):
    r = g.one_node("Reshape", [("X", list(in_shape)), ("s", None)], {"X": spec},
                   inits=[g.const("s", list(out_shape))])
    out = g.out(r)
    assert out is not None and g.codes(r, "warning") == []
    assert held(spec, in_shape) == held(out, out_shape), out


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1)])
def test_transpose_moves_no_data(g, perm):
    shape, spec = (4, 6, 8), "2:2,0:2 @ [0,1,2,3]"
    r = g.one_node("Transpose", [("X", list(shape))], {"X": spec}, perm=list(perm))
    out_shape = tuple(shape[p] for p in perm)
    before = held(spec, shape)
    # element (i, j, k) has the same flat id in both layouts once transposed
    ids = np.arange(int(np.prod(shape))).reshape(shape).transpose(perm)
    after = {d: {int(ids.ravel()[i]) for i in s} for d, s in held(g.out(r), out_shape).items()}
    assert before == after


@pytest.mark.parametrize(
    "a_shape, a_spec, b_shape, b_spec",
    [
        ((4, 1), "0:2 @ [{0,1},{2,3}]", (1, 6), "1:2 @ [{0,2},{1,3}]"),
        ((4, 6), "0:2 @ [{0,1},{2,3}]", (1, 6), "1:2 @ [{0,2},{1,3}]"),
        ((2, 4, 6), "1:2 @ [{0,1},{2,3}]", (6,), "0:2 @ [{0,2},{1,3}]"),
    ],
)
def test_broadcast_output_devices_hold_what_they_need(g, a_shape, a_spec, b_shape, b_spec):
    r = g.one_node("Mul", [("A", list(a_shape)), ("B", list(b_shape))], {"A": a_spec, "B": b_spec})
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    out_held = held(g.out(r), out_shape)
    a_held, b_held = held(a_spec, a_shape), held(b_spec, b_shape)
    a_ids = np.broadcast_to(np.arange(int(np.prod(a_shape))).reshape(a_shape), out_shape).ravel()
    b_ids = np.broadcast_to(np.arange(int(np.prod(b_shape))).reshape(b_shape), out_shape).ravel()
    for device, elements in out_held.items():
        for e in elements:
            assert a_ids[e] in a_held.get(device, ()) and b_ids[e] in b_held.get(device, ())


def test_reshape_that_scatters_shards_gathers_with_a_warning(g):
    # (3, 4 in 2, 2) -> (2, 6, 2): shard = (flat % 8) // 4 mixes output axes 0 and 1.
    r = g.one_node("Reshape", [("X", [3, 4, 2]), ("s", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("s", [2, 6, 2])])
    assert g.codes(r, "warning") == ["reshape-unsupported"]
    assert g.out(r) == "replicated @ [{0,1}]"
