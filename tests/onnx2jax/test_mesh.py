"""Spec -> mesh mapping, as pure functions (no jax devices involved)."""

import pytest

from sharding.mesh.layout import MeshMappingError, MeshPlan, layout_of
from sharding.mesh.mapping import map_specs
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim


def test_proposal_0007_broadcast_composition():
    mapping = map_specs(
        {
            "out": layout_of(ShardingSpec.split("o", {0: 2, 1: 2}, [0, 1, 2, 3]), (4, 6)),
            "in1": layout_of(ShardingSpec.split("a", {0: 2}, [(0, 1), (2, 3)]), (4, 1)),
            "in2": layout_of(ShardingSpec.split("b", {1: 2}, [(0, 2), (1, 3)]), (1, 6)),
        },
        4,
    )
    assert mapping.plan == MeshPlan(("d0", "d1"), (2, 2), (0, 1, 2, 3))
    assert mapping.pspecs == {"out": (("d0",), ("d1",)), "in1": (("d0",), None), "in2": (None, ("d1",))}


def test_megatron_specs_merge_into_one_axis():
    devices = range(8)
    mapping = map_specs(
        {
            "col": layout_of(ShardingSpec.split("w1", {1: 8}, devices), (16, 64)),
            "row": layout_of(ShardingSpec.split("w2", {0: 8}, devices), (64, 16)),
            "rep": layout_of(ShardingSpec.replicated("x", devices), (4, 16)),
        },
        8,
    )
    assert mapping.plan.axis_sizes == (8,)
    assert mapping.pspecs == {"col": (None, ("d0",)), "row": (("d0",), None), "rep": (None, None)}


def test_specs_sharing_a_layout_are_searched_once(monkeypatch):
    # A model's thousands of specs share a few layouts (every column-split activation, whatever its rank), and a
    # call's shapes map them all again: the search of mesh axes runs once per distinct layout and mesh.
    from sharding.mesh import layout as layout_module

    searched = []
    real = layout_module._devices_for
    monkeypatch.setattr(layout_module, "_devices_for", lambda *a: searched.append(a) or real(*a))
    layout_module._assignment.cache_clear()
    devices = [3, 1, 2, 0, 7, 5, 6, 4]
    layouts = {
        f"t{rank}": layout_of(ShardingSpec.split(f"t{rank}", {rank - 1: 8}, devices), (4,) * (rank - 1) + (64,))
        for rank in range(1, 6)
    }
    alone = map_specs({"t1": layouts["t1"]}, 8)
    once = len(searched)
    together = map_specs(layouts, 8)
    assert map_specs(layouts, 8) == together and len(searched) == once > 0
    assert together.plan == alone.plan and together.plan.device_order == tuple(devices)
    assert together.pspecs == {key: (None,) * (int(key[1:]) - 1) + (("d0",),) for key in layouts}


def test_permuted_devices_become_the_mesh_order():
    mapping = map_specs({"p": layout_of(ShardingSpec.split("p", {0: 4}, [3, 1, 2, 0]), (8,))}, 4)
    assert mapping.plan.device_order == (3, 1, 2, 0)
    assert mapping.pspecs["p"] == (("d0",),)


def test_two_specs_with_transposed_device_orders_share_a_mesh():
    mapping = map_specs(
        {
            "a": layout_of(ShardingSpec.split("a", {0: 4}, [0, 1, 2, 3]), (4,)),
            "b": layout_of(ShardingSpec.split("b", {0: 4}, [0, 2, 1, 3]), (4,)),
        },
        4,
    )
    # Devices [[0, 1], [2, 3]]: a's shard k is on device k when d0 is the major
    # axis; b's order 0, 2, 1, 3 is the same grid read column-major.
    assert mapping.plan == MeshPlan(("d0", "d1"), (2, 2), (0, 1, 2, 3))
    assert mapping.pspecs == {"a": (("d0", "d1"),), "b": (("d1", "d0"),)}


def test_fused_axis_expands_into_sub_axes():
    gate_up = ShardingSpec(
        "w", (ShardedDim(1, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(2, dim_value=8))),), devices=(0, 1)
    )
    layout = layout_of(gate_up, (4, 16))
    assert layout.fused == ((1, (2, 8)),)
    assert layout.expand((4, 16)) == (4, 2, 8)
    assert map_specs({"w": layout}, 2).pspecs["w"] == (None, None, ("d0",))


def test_partial_spec_reports_replica_devices():
    mapping = map_specs(
        {
            "sub": layout_of(ShardingSpec.split("q", {0: 2}, [0, 1]), (4,)),
            "all": layout_of(ShardingSpec.split("w", {1: 8}, range(8)), (2, 8)),
        },
        8,
    )
    assert mapping.partial == {"sub": frozenset({2, 3, 4, 5, 6, 7})}


def test_user_mesh_row_major():
    plan = MeshPlan(("data", "model"), (2, 4), tuple(range(8)))
    batch = ShardingSpec.split("x", {0: 2}, [(0, 1, 2, 3), (4, 5, 6, 7)])
    model = ShardingSpec.split("w", {1: 4}, [(0, 4), (1, 5), (2, 6), (3, 7)])
    mapping = map_specs({"x": layout_of(batch, (4, 16)), "w": layout_of(model, (16, 32))}, 8, plan)
    assert mapping.pspecs == {"x": (("data",), None), "w": (None, ("model",))}


def test_inexpressible_spec_is_named_with_its_devices():
    with pytest.raises(MeshMappingError, match=r"(?s)1 sharding spec\(s\) cannot be expressed.*odd: shard grid 2, shard devices \{0,3\}, \{1,2\}"):
        map_specs(
            {
                "all": layout_of(ShardingSpec.split("a", {0: 4}, [0, 1, 2, 3]), (4,)),
                "odd": layout_of(ShardingSpec.split("b", {0: 2}, [(0, 3), (1, 2)]), (4,)),
            },
            4,
        )
