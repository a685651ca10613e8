"""The one configuration rule (sharding.configuration): what inference and compile both choose."""

from __future__ import annotations

import onnx
import onnx.helper as oh

from sharding.annotate import add_configuration
from sharding.configuration import choose_configuration
from sharding import infer


def _model(*configurations: str) -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    for name in configurations:
        add_configuration(model, name, 2)
    return model


def test_one_configuration_is_chosen_silently() -> None:
    choice = choose_configuration(_model("tp"))
    assert (choice.name, choice.diagnostics, choice.guessed, choice.unknown) == ("tp", (), False, False)


def test_several_give_the_first_and_say_so() -> None:
    choice = choose_configuration(_model("tp", "dp"))
    assert choice.name == "tp" and choice.guessed and [d.code for d in choice.diagnostics] == ["configuration-chosen"]
    assert infer(_model("tp", "dp")).configuration == "tp"  # inference follows the same rule


def test_an_unknown_name_is_an_error_and_none_defined_is_unannotated() -> None:
    choice = choose_configuration(_model("tp"), "dp")
    assert choice.unknown and [d.code for d in choice.diagnostics] == ["unknown-configuration"]
    assert choose_configuration(_model()).name is None
    assert choose_configuration(_model("tp", "dp"), "dp").diagnostics == ()
