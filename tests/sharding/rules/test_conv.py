"""Conv, ConvTranspose, pooling, BatchNorm/InstanceNorm, Resize: channels free, spatial refused."""

import numpy as np


def _conv(g, x_spec, w_spec, *, group=1, c=8, m=8, transpose=False, b_spec=None):
    w_shape = [c, m // group, 3, 3] if transpose else [m, c // group, 3, 3]
    inputs = [("X", [2, c, 10, 10]), ("W", w_shape)]
    specs = {"X": x_spec, "W": w_spec}
    if b_spec is not None:
        inputs.append(("B", [m]))
        specs["B"] = b_spec
    specs = {k: v for k, v in specs.items() if v is not None}
    return g.one_node("ConvTranspose" if transpose else "Conv", inputs, specs, group=group,
                      pads=[1, 1, 1, 1])


def test_batch_split_passes_through(g):
    r = _conv(g, "0:2 @ [0,1]", "replicated @ [{0,1}]")
    assert g.out(r) == "0:2 @ [0,1]"
    assert g.codes(r, "error") == []


def test_output_channels_follow_a_split_weight(g):
    r = _conv(g, "replicated @ [{0,1,2,3}]", "0:4 @ [0,1,2,3]", b_spec="0:4 @ [0,1,2,3]")
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    assert g.codes(r, "error") == []


def test_input_channels_are_a_reduction(g):
    r = _conv(g, "1:4 @ [0,1,2,3]", "1:4 @ [0,1,2,3]")
    assert g.out(r) == "replicated @ [{0,1,2,3}]"
    assert "collective" in g.codes(r)  # the partial sums meet in an all-reduce
    assert g.codes(r, "error") == []


def test_input_channels_split_against_a_replicated_weight_still_reduce(g):
    # every device holds all of W, so it has the K block its X shard needs (as MatMul)
    r = _conv(g, "1:4 @ [0,1,2,3]", "replicated @ [{0,1,2,3}]")
    assert g.out(r) == "replicated @ [{0,1,2,3}]"
    assert g.codes(r) == ["collective"]


def test_input_channels_cut_differently_is_an_error(g):
    r = _conv(g, "1:4 @ [0,1,2,3]", "1:4 @ [3,2,1,0]")
    assert g.codes(r, "error")


def test_grouped_conv_keeps_a_group_aligned_channel_split(g):
    r = _conv(g, "1:4 @ [0,1,2,3]", "0:4 @ [0,1,2,3]", group=4)
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    assert g.codes(r) == []  # no collective at all


def test_depthwise_conv_with_channel_multiplier(g):
    r = _conv(g, "1:8 @ [0,1,2,3,4,5,6,7]", "0:8 @ [0,1,2,3,4,5,6,7]", group=8, c=8, m=16)
    assert g.out(r) == "1:8 @ [0,1,2,3,4,5,6,7]"
    assert g.codes(r) == []


def test_channel_split_that_cuts_a_group_is_refused_by_name(g):
    r = _conv(g, "1:4 @ [0,1,2,3]", "0:4 @ [0,1,2,3]", group=2)
    errors = [d for d in r.diagnostics if d.severity == "error"]
    assert [d.code for d in errors] == ["group-split"]
    assert errors[0].tensor == "X" and errors[0].axis == 1


def test_spatial_split_is_refused_by_name(g):
    r = _conv(g, "2:2 @ [0,1]", "replicated @ [{0,1}]")
    errors = [d for d in r.diagnostics if d.severity == "error"]
    assert [(d.code, d.tensor, d.axis) for d in errors] == [("spatial-axis-sharded", "X", 2)]
    assert "halo" in errors[0].message
    assert g.out(r) is None


def test_conv_transpose_mirrors_the_weight_axes(g):
    r = _conv(g, "replicated @ [{0,1}]", "1:2 @ [0,1]", transpose=True)
    assert g.out(r) == "1:2 @ [0,1]"
    r = _conv(g, "1:2 @ [0,1]", "0:2 @ [0,1]", transpose=True)
    assert g.out(r) == "replicated @ [{0,1}]"
    assert "collective" in g.codes(r)


def test_maxpool_keeps_channels_and_refuses_spatial(g):
    r = g.one_node("MaxPool", [("X", [2, 8, 10, 10])], {"X": "1:4 @ [0,1,2,3]"},
                   kernel_shape=[2, 2], strides=[2, 2])
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    r = g.one_node("AveragePool", [("X", [2, 8, 10, 10])], {"X": "3:2 @ [0,1]"}, kernel_shape=[3, 3])
    assert [(d.code, d.axis) for d in r.diagnostics if d.severity == "error"] == [
        ("spatial-axis-sharded", 3)]


def test_global_pool_reduces_the_spatial_axes(g):
    r = g.one_node("GlobalAveragePool", [("X", [2, 8, 4, 4])], {"X": "1:2 @ [0,1]"})
    assert g.out(r) == "1:2 @ [0,1]"
    r = g.one_node("GlobalMaxPool", [("X", [2, 8, 4, 4])], {"X": "2:2 @ [0,1]"})
    assert g.out(r) == "replicated @ [{0,1}]"
    assert "collective" in g.codes(r)


def test_batchnorm_parameters_follow_the_channels(g):
    inputs = [("X", [2, 8, 4, 4])] + [(n, [8]) for n in ("s", "b", "mean", "var")]
    specs = {n: "0:4 @ [0,1,2,3]" for n in ("s", "b", "mean", "var")}
    specs["X"] = "1:4 @ [0,1,2,3]"
    r = g.one_node("BatchNormalization", inputs, specs)
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    assert g.codes(r, "error") == []
    specs["s"] = "0:4 @ [3,2,1,0]"
    r = g.one_node("BatchNormalization", inputs, specs)
    assert g.codes(r, "error")  # scale blocks on other devices than the channels they scale


def test_instance_norm_over_a_split_spatial_axis_comes_out_whole(g):
    r = g.one_node("InstanceNormalization", [("X", [2, 8, 4, 4]), ("s", [8]), ("b", [8])],
                   {"X": "1:2 @ [0,1]", "s": "0:2 @ [0,1]", "b": "0:2 @ [0,1]"})
    assert g.out(r) == "1:2 @ [0,1]"
    r = g.one_node("InstanceNormalization", [("X", [2, 8, 4, 4]), ("s", [8]), ("b", [8])],
                   {"X": "2:2 @ [0,1]"})
    assert g.out(r) == "replicated @ [{0,1}]"


def test_resize_keeps_channels_and_refuses_a_resized_split_axis(g):
    scales = g.const("scales", np.array([1, 1, 2, 2], np.float32))
    inputs = [("X", [2, 8, 4, 4]), ("", None), ("scales", None)]
    r = g.one_node("Resize", inputs, {"X": "1:2 @ [0,1]"}, inits=[scales], mode="nearest")
    assert g.out(r) == "1:2 @ [0,1]"
    r = g.one_node("Resize", inputs, {"X": "2:2 @ [0,1]"}, inits=[scales], mode="nearest")
    assert [(d.code, d.axis) for d in r.diagnostics if d.severity == "error"] == [
        ("spatial-axis-sharded", 2)]
