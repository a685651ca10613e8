"""A plan's mesh axis that no product of a torus's axes makes is laid over the target by splitting one.

The automatic plan's winner for a 70B-shaped decoder on v5p:4x4x4 ("tensor 64, kv-groups") has mesh axes
(8, 8); jax's ``create_device_mesh`` refuses 8 on a 4x4x4 torus unless a physical axis may be split.
Reference: the topology's own device list (every device once) and the axis sizes asked for.
"""

from __future__ import annotations

import pytest

from onnx2jax.runtime import targets

pytestmark = pytest.mark.skipif(not targets.libtpu_available(), reason="libtpu (the test extra) is not installed")


def test_an_axis_of_8_on_a_4x4x4_torus_is_laid_out_by_splitting_a_physical_axis():
    target = targets.parse_target("tpu:v5p:4x4x4")
    mesh = targets.target_mesh(target, ("groups", "tensor"), (8, 8), None)
    assert mesh.devices.shape == (8, 8)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in target.devices())


def test_an_axis_the_torus_makes_keeps_the_unsplit_layout():
    from jax.experimental import mesh_utils

    target = targets.parse_target("tpu:v5p:4x4x4")
    mesh = targets.target_mesh(target, ("data", "tensor"), (4, 16), None)
    assert (mesh.devices == mesh_utils.create_device_mesh((4, 16), target.devices())).all()
