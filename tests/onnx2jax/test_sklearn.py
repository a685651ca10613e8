"""scikit-learn models exported with skl2onnx: onnx2jax against onnxruntime's stored outputs.

The fixtures (tests/data/sklearn, made by scripts/make_sklearn_fixtures.py, which
checks onnxruntime against scikit-learn itself) cover linear models, forests,
gradient boosting, pipelines with a scaler or a one-hot encoder, and SVMs; every
classifier with and without ZipMap. Labels must be equal, probabilities and
regression outputs within float32 rounding.
"""

import pathlib

import numpy as np
import pytest

from onnx2jax.translate import translate

DATA = pathlib.Path(__file__).parents[1] / "data" / "sklearn"
MODELS = sorted(p.name[: -len(".onnx")] for p in DATA.glob("*.onnx"))


def _inputs(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.inputs.npz") as data:
        return {k: v.astype(object) if v.dtype.kind == "U" else v for k, v in data.items()}


def _expected(name: str) -> dict[str, object]:
    """Output name -> onnxruntime's value; ZipMap outputs back as lists of dicts."""
    with np.load(DATA / f"{name}.ort_outputs.npz") as data:
        stored = dict(data.items())
    outputs = {}
    for key, value in stored.items():
        if key.endswith(".keys"):
            name_ = key[: -len(".keys")]
            keys = [k.item() for k in value]
            outputs[name_] = [dict(zip(keys, row.tolist())) for row in stored[f"{name_}.values"]]
        elif not key.endswith(".values"):
            outputs[key] = value
    return outputs


def test_the_fixtures_are_there():
    assert len(MODELS) >= 20, MODELS


@pytest.mark.parametrize("name", MODELS)
def test_sklearn_model_matches_onnxruntime(name):
    model = translate(str(DATA / f"{name}.onnx"))
    expected = _expected(name)
    actual = dict(zip(model.output_names, model(**_inputs(name))))
    assert set(actual) == set(expected)
    for output, want in expected.items():
        got = actual[output]
        if isinstance(want, list):  # ZipMap: one {label: probability} dict per row
            assert isinstance(got, list) and len(got) == len(want)
            for got_row, want_row in zip(got, want):
                assert list(got_row) == list(want_row)
                np.testing.assert_allclose(list(got_row.values()), list(want_row.values()), rtol=1e-5, atol=1e-5)
        elif want.dtype.kind == "U":  # string labels
            assert np.asarray(got).dtype == object and np.asarray(got).tolist() == want.tolist(), output
        elif want.dtype.kind in "iu":
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=output)
            assert np.asarray(got).dtype == want.dtype
        else:
            assert np.asarray(got).dtype == want.dtype and np.asarray(got).shape == want.shape, output
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=output)
