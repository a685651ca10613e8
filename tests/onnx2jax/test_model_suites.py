"""The real models that the onnx wheel carries, run through onnx2jax.

``onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}/<test>/``
hold a ``model.onnx`` with ``test_data_set_*/input_*.pb`` and ``output_*.pb``.
``light/light_<name>.onnx`` are CNNs whose weights are ``ConstantOfShape``
nodes; like ``onnx.backend.test.runner``, their input is ``arange(n) / n`` in
the input's shape and the expected output is ``light_<name>_output_0.pb``, with
the rtol/atol of ``real/test_<name>/data.json``. Outputs are compared as ONNX's
runner does: same dtype, ``assert_allclose`` with rtol 1e-3 / atol 1e-7 unless
the case says otherwise.

Models that fail for a reason outside onnx2jax's scope are listed in XFAILS
(strict, so a fix shows up); models too slow for the default run in SLOW.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from onnx2jax import translate
from onnx2jax.conformance import assert_outputs_match

DATA_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SUITES = ("pytorch-converted", "pytorch-operator", "simple")

_PRELU_6_CHANNEL_SLOPE = (
    "PRelu-6 takes a slope of one element or X's shape; these PyTorch 0.3 exports give a per-channel (C,) slope"
)

XFAILS: dict[str, str] = {
    "pytorch-converted/test_PReLU_1d_multiparam": _PRELU_6_CHANNEL_SLOPE,
    "pytorch-converted/test_PReLU_2d_multiparam": _PRELU_6_CHANNEL_SLOPE,
    "pytorch-converted/test_PReLU_3d_multiparam": _PRELU_6_CHANNEL_SLOPE,
    "simple/test_gradient_of_add": "Gradient (ai.onnx.preview.training) is a training op, not translated",
    "simple/test_gradient_of_add_and_mul": "Gradient (ai.onnx.preview.training) is a training op, not translated",
}

# 10-16 s each on 2 CPU cores (224x224 CNNs); the other light models take 4-8 s.
SLOW: set[str] = {"light/vgg19", "light/densenet121", "light/inception_v1", "light/inception_v2",
                  "light/zfnet512"}  # zfnet512: alexnet's layers, wider (3 s)


@dataclasses.dataclass
class ModelCase:
    id: str
    model_path: str
    data_sets: list[tuple[list[str], list[str]]]  # (input .pb files, output .pb files)
    rtol: float = 1e-3
    atol: float = 1e-7
    dummy_input: bool = False  # light models: inputs are arange(n) / n


def _read_value(path: str, type_proto: onnx.TypeProto | None) -> Any:
    """One .pb file as numpy (tensor), list (sequence) or optional, per the graph's declared type."""
    with open(path, "rb") as f:
        data = f.read()
    kind = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return onnx.numpy_helper.to_list(proto)
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return onnx.numpy_helper.to_optional(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return onnx.numpy_helper.to_array(proto)


def _directory_cases() -> list[ModelCase]:
    cases = []
    for suite in SUITES:
        for case_dir in sorted(glob.glob(os.path.join(DATA_DIR, suite, "*"))):
            model_path = os.path.join(case_dir, "model.onnx")
            if not os.path.exists(model_path):
                continue
            rtol, atol = 1e-3, 1e-7
            if os.path.exists(os.path.join(case_dir, "data.json")):
                with open(os.path.join(case_dir, "data.json")) as f:
                    data = json.load(f)
                rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
            sets = []
            for set_dir in sorted(glob.glob(os.path.join(case_dir, "test_data_set_*"))):
                inputs = sorted(glob.glob(os.path.join(set_dir, "input_*.pb")), key=_pb_index)
                outputs = sorted(glob.glob(os.path.join(set_dir, "output_*.pb")), key=_pb_index)
                sets.append((inputs, outputs))
            cases.append(ModelCase(f"{suite}/{os.path.basename(case_dir)}", model_path, sets, rtol, atol))
    return cases


def _light_cases() -> list[ModelCase]:
    cases = []
    for real_dir in sorted(glob.glob(os.path.join(DATA_DIR, "real", "test_*"))):
        with open(os.path.join(real_dir, "data.json")) as f:
            data = json.load(f)
        name = data["model_name"]
        model_path = os.path.join(DATA_DIR, "light", f"light_{name}.onnx")
        output = os.path.join(DATA_DIR, "light", f"light_{name}_output_0.pb")
        if not (os.path.exists(model_path) and os.path.exists(output)):
            continue
        cases.append(
            ModelCase(f"light/{name}", model_path, [([], [output])], data.get("rtol", 1e-3), data.get("atol", 1e-7), True)
        )
    return cases


def _pb_index(path: str) -> int:
    return int(os.path.basename(path).split("_")[1].split(".")[0])


def _dummy_input(info: onnx.ValueInfoProto) -> np.ndarray:
    # As onnx.backend.test.runner.Runner.generate_dummy_data(random=False).
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def _params():
    for case in _directory_cases() + _light_cases():
        marks = []
        if case.id in XFAILS:
            marks.append(pytest.mark.xfail(reason=XFAILS[case.id], strict=True))
        if case.id in SLOW:
            marks.append(pytest.mark.slow)
        yield pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_model(case: ModelCase):
    proto = onnx.load(case.model_path)
    model = translate(proto)
    graph_inputs = {i.name: i for i in proto.graph.input}
    runtime_inputs = [graph_inputs[name] for name in model.input_names]
    for index, (input_files, output_files) in enumerate(case.data_sets):
        if case.dummy_input:
            feeds = {info.name: _dummy_input(info) for info in runtime_inputs}
        else:
            # input_i.pb follows the graph's inputs in order (initializers included in old models).
            feeds = {}
            for path, info in zip(input_files, proto.graph.input):
                feeds[info.name] = _read_value(path, info.type)
            feeds = {name: value for name, value in feeds.items() if name in model.input_names}
        actual = model(**feeds)
        assert len(actual) == len(output_files)
        for path, info, value in zip(output_files, proto.graph.output, actual):
            expected = _read_value(path, info.type)
            assert_outputs_match(expected, value, case.rtol, case.atol, f"{case.id} set {index} output {info.name!r}")
