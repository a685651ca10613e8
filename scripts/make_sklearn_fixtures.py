"""Make the scikit-learn fixtures in tests/data/sklearn/ (skl2onnx exports, onnxruntime outputs).

Needs scikit-learn and skl2onnx, which neither the library nor its tests import
(use a separate venv):

    pip install scikit-learn skl2onnx onnx onnxruntime numpy
    python scripts/make_sklearn_fixtures.py

Each model is fitted on small synthetic data (numpy seed 0) and exported with
skl2onnx (ai.onnx 17, ai.onnx.ml 3). Classifiers are exported twice:
``NAME.onnx`` with skl2onnx's default ZipMap (probabilities as a list of
``{label: probability}`` dicts) and ``NAME_nozipmap.onnx`` with the
probability matrix. For each file:

    tests/data/sklearn/NAME.onnx              the model
    tests/data/sklearn/NAME.inputs.npz        20 test rows, keyed by input name
    tests/data/sklearn/NAME.ort_outputs.npz   onnxruntime's outputs (CPU), keyed by output name;
                                              a ZipMap output OUT is stored as OUT.keys [C] and
                                              OUT.values [N, C] (row i is the dict of row i)

and tests/data/sklearn/README.md listing them. The script checks that
onnxruntime's labels equal scikit-learn's ``predict`` and its probabilities
``predict_proba`` (within 1e-5).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
import skl2onnx
import sklearn
from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor, RandomForestClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC, SVR
from sklearn.tree import DecisionTreeClassifier
from skl2onnx import to_onnx
from skl2onnx.common.data_types import Int64TensorType, StringTensorType

OPSETS = {"": 17, "ai.onnx.ml": 3}
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _data():
    """Training and test sets: 4 float features; 3-class, binary (string) and regression targets."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y3 = ((x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 0.5)).astype(np.int64)
    y2 = np.where(x[:, 0] - 0.5 * x[:, 3] > 0, "yes", "no")
    yr = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(200)).astype(np.float32)
    colour = rng.choice(np.array(["red", "green", "blue"]), size=(200, 1))
    return x[:180], x[180:], y3[:180], y2[:180], yr[:180], colour[:180], colour[180:]


def _models():
    """(name, fitted estimator, skl2onnx initial_types or None, test inputs {name: array})."""
    x, x_test, y3, y2, yr, colour, colour_test = _data()
    feeds = {"X": x_test}
    # Two categorical columns (strings, and the same as int64 codes) that decide the class with x0.
    categories = np.stack([colour[:, 0], np.where(x[:, 1] > 0, "up", "down")], axis=1)
    categories_test = np.stack([colour_test[:, 0], np.where(x_test[:, 1] > 0, "up", "down")], axis=1)
    mixed_y = (categories[:, 0] == "red").astype(int) * 2 + (categories[:, 1] == "up")
    codes = {"red": 0, "green": 1, "blue": 2, "up": 5, "down": 7}
    as_codes = np.vectorize(codes.get)
    onehot_strings = make_pipeline(OneHotEncoder(), DecisionTreeClassifier(max_depth=4, random_state=0))
    onehot_ints = make_pipeline(OneHotEncoder(handle_unknown="ignore"), DecisionTreeClassifier(max_depth=4, random_state=0))
    onehot_strings.fit(categories, mixed_y)
    onehot_ints.fit(as_codes(categories).astype(np.int64), mixed_y)
    return [
        ("logistic_regression", LogisticRegression(max_iter=500).fit(x, y3), None, feeds),
        ("logistic_regression_binary_strings", LogisticRegression().fit(x, y2), None, feeds),
        ("random_forest", RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(x, y3), None, feeds),
        ("gradient_boosting_binary", GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=0).fit(x, y2),
         None, feeds),
        ("gradient_boosting", GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=0).fit(x, y3), None,
         feeds),
        ("gradient_boosting_regressor", GradientBoostingRegressor(n_estimators=20, max_depth=3, random_state=0).fit(x, yr),
         None, feeds),
        ("scaler_logistic_regression", make_pipeline(StandardScaler(), LogisticRegression()).fit(x * 10 + 3, y3), None,
         {"X": x_test * 10 + 3}),
        ("scaler_linear_regression", make_pipeline(StandardScaler(), LinearRegression()).fit(x * 10 + 3, yr), None,
         {"X": x_test * 10 + 3}),
        ("onehot_tree", onehot_strings, [("X", StringTensorType([None, 2]))], {"X": categories_test.astype(object)}),
        ("onehot_int_tree", onehot_ints, [("X", Int64TensorType([None, 2]))],
         {"X": as_codes(categories_test).astype(np.int64)}),
        ("svc", SVC(probability=True, random_state=0).fit(x, y3), None, feeds),
        ("svr", SVR().fit(x, yr), None, feeds),
    ]


def _is_classifier(estimator) -> bool:
    return hasattr(estimator, "predict_proba")


def _export(estimator, types, sample, zipmap: bool) -> onnx.ModelProto:
    options = {id(estimator): {"zipmap": False}} if _is_classifier(estimator) and not zipmap else None
    if types is None:
        return to_onnx(estimator, sample, target_opset=OPSETS, options=options)
    return to_onnx(estimator, initial_types=types, target_opset=OPSETS, options=options)


def _save(out: pathlib.Path, name: str, model: onnx.ModelProto, feeds: dict, estimator) -> list[str]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = session.run(None, feeds)
    stored = {}
    for info, value in zip(session.get_outputs(), results):
        if isinstance(value, list):  # ZipMap: a list of dicts
            keys = list(value[0])
            stored[f"{info.name}.keys"] = np.asarray(keys)
            stored[f"{info.name}.values"] = np.array([[row[k] for k in keys] for row in value], np.float32)
        else:
            stored[info.name] = value.astype(np.str_) if value.dtype == object else value
    inputs = feeds["X"]
    if _is_classifier(estimator):
        np.testing.assert_array_equal(np.asarray(results[0]).astype(str), estimator.predict(inputs).astype(str))
        probabilities = results[1] if not isinstance(results[1], list) else stored[f"{session.get_outputs()[1].name}.values"]
        np.testing.assert_allclose(probabilities, estimator.predict_proba(inputs), atol=1e-5)
    else:
        np.testing.assert_allclose(results[0].reshape(-1), estimator.predict(inputs), rtol=1e-4, atol=1e-4)
    onnx.save(model, out / f"{name}.onnx")
    np.savez(out / f"{name}.inputs.npz", **{k: v.astype(np.str_) if v.dtype == object else v for k, v in feeds.items()})
    np.savez(out / f"{name}.ort_outputs.npz", **stored)
    ops = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in model.graph.node})
    return [f"| `{name}` | {type(estimator).__name__} | {', '.join(ops)} |"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "tests" / "data" / "sklearn")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, estimator, types, feeds in _models():
        sample = feeds.get("X")
        rows += _save(args.out, name, _export(estimator, types, sample, zipmap=True), feeds, estimator)
        if _is_classifier(estimator):
            rows += _save(args.out, f"{name}_nozipmap", _export(estimator, types, sample, zipmap=False), feeds, estimator)
    readme = [
        "# tests/data/sklearn: scikit-learn models exported with skl2onnx",
        "",
        "Generated by `scripts/make_sklearn_fixtures.py`; do not edit by hand (see its docstring for the layout of",
        "the `.npz` files). Made with scikit-learn {}, skl2onnx {}, onnx {}, onnxruntime {}, numpy {};".format(
            sklearn.__version__, skl2onnx.__version__, onnx.__version__, ort.__version__, np.__version__),
        "opsets ai.onnx 17, ai.onnx.ml 3. The script checks onnxruntime against scikit-learn's predict/predict_proba.",
        "",
        "| file | estimator | ops |",
        "| --- | --- | --- |",
        *rows,
        "",
    ]
    (args.out / "README.md").write_text("\n".join(readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
