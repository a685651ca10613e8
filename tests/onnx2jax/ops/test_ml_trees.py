"""Tree ensembles (ai.onnx.ml) against onnxruntime and ONNX's reference evaluator, on random forests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest

from onnx2jax.ops import ml_trees
from onnx2jax.translate import translate

from tests.onnx2jax.ops import opcheck
from tests.onnx2jax.ops.ml_forests import features, random_forest

# What the translator fills in from the schema when the test calls the implementation directly.
SCHEMA_DEFAULTS = {"aggregate_function": "SUM", "post_transform": "NONE"}

ML = "ai.onnx.ml"
check = functools.partial(opcheck.check, domain=ML, ai_onnx_opset=19, rtol=1e-5, atol=1e-5)


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "aggregate, n_targets, seed",
    [("SUM", 1, 0), ("MIN", 3, 2), pytest.param("AVERAGE", 3, 1, marks=SLOW), pytest.param("MAX", 1, 3, marks=SLOW),
     pytest.param("SUM", 3, 0, marks=SLOW)],
)
def test_regressor(seed, aggregate, n_targets):
    rng = np.random.default_rng(seed)
    attrs = random_forest(rng, n_trees=5, n_features=4, n_targets=n_targets, ids="target", targets_per_leaf=1 + seed % 2)
    base = {} if seed % 2 else {"base_values": [0.5] * n_targets}
    check("TreeEnsembleRegressor", 3, [features(rng, 40, 4)], n_targets=n_targets, aggregate_function=aggregate,
          **base, **attrs)


def test_regressor_probit():
    rng = np.random.default_rng(7)
    attrs = random_forest(rng, n_trees=3, n_features=3, n_targets=1, ids="target", max_depth=3)
    attrs["target_weights"] = [abs(w) / 4 + 0.1 for w in attrs["target_weights"]]  # probit of values in (0, 1)
    check("TreeEnsembleRegressor", 1, [features(rng, 20, 3, nan=False)], n_targets=1, post_transform="PROBIT",
          aggregate_function="AVERAGE", rtol=1e-4, **attrs)


@pytest.mark.parametrize(
    "transform, base, seed",
    [("SOFTMAX", [0.1, -0.2, 0.3], 1), ("LOGISTIC", None, 2), pytest.param("NONE", None, 0, marks=SLOW),
     pytest.param("SOFTMAX_ZERO", [0.1, -0.2, 0.3], 0, marks=SLOW)],
)
def test_multiclass(seed, transform, base):
    rng = np.random.default_rng(seed)
    attrs = random_forest(rng, n_trees=4, n_features=5, n_targets=3, targets_per_leaf=1 + seed % 3)
    extra = {} if base is None else {"base_values": base}
    check("TreeEnsembleClassifier", 3, [features(rng, 50, 5)], n_out=2, classlabels_int64s=[4, 7, 9],
          post_transform=transform, **extra, **attrs)


_QUICK = {("one class", "SOFTMAX"), ("positive one class", "NONE"), ("both classes", "LOGISTIC"), ("either class", "NONE")}
BINARY_CASES = [
    pytest.param(leaves, base, transform, marks=[] if (leaves, transform) in _QUICK else SLOW)
    for leaves in ("one class", "positive one class", "both classes", "either class")
    for base, transform in ((None, "NONE"), ([0.3], "LOGISTIC"), ([0.2, 0.2], "SOFTMAX"))
    # Leaves naming either class with one base value: where a row reaches no class-1 weight,
    # onnxruntime writes only the first score and leaves the second as the buffer held it.
    if not (leaves == "either class" and base == [0.3])
]


@pytest.mark.parametrize("leaves, base, transform", BINARY_CASES)
def test_binary(leaves, base, transform):
    # onnxruntime's two-class cases: weights for class 1 only (gradient boosting), for both (forests), mixed.
    rng = np.random.default_rng(len(leaves))
    attrs = random_forest(rng, n_trees=3, n_features=4, n_targets=2, targets_per_leaf=None if leaves == "both classes" else 1)
    if leaves in ("one class", "positive one class"):
        attrs["class_ids"] = [1] * len(attrs["class_ids"])
    if leaves == "positive one class":
        attrs["class_weights"] = [abs(w) for w in attrs["class_weights"]]
    extra = {} if base is None else {"base_values": base}
    check("TreeEnsembleClassifier", 3, [features(rng, 50, 4)], n_out=2, classlabels_int64s=[0, 1],
          post_transform=transform, **extra, **attrs)


def test_string_labels_and_double_input():
    # String class names come back as strings (chosen by a traced index, finished on the host).
    rng = np.random.default_rng(3)
    attrs = random_forest(rng, n_trees=3, n_features=2, n_targets=3)
    model, feeds = opcheck.single_node_model(
        "TreeEnsembleClassifier", 3, [features(rng, 30, 2).astype(np.float64)], n_out=2, domain=ML, ai_onnx_opset=19,
        classlabels_strings=["a", "b", "c"], post_transform="SOFTMAX", **attrs,
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    labels, scores = translate(model)(*feeds.values())
    assert labels.dtype == object and labels.tolist() == expected[0].tolist()
    np.testing.assert_allclose(np.asarray(scores), expected[1], rtol=1e-5, atol=1e-6)


def test_opset_5_against_the_reference():
    # TreeEnsemble-5: leaves apart from nodes, set membership, two trees (the second a stump).
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=(30, 3)).astype(np.float32)
    x[::7, 1] = np.nan
    attrs = dict(
        nodes_featureids=[0, 1, 2, 1], nodes_modes=np.array([0, 6, 3, 5], np.uint8),
        nodes_splits=np.array([2.0, np.nan, 1.5, 3.0], np.float32),
        membership_values=np.array([1.0, 3.0, np.nan], np.float32),
        nodes_truenodeids=[1, 0, 2, 4], nodes_trueleafs=[0, 1, 1, 1], nodes_falsenodeids=[2, 1, 3, 5],
        nodes_falseleafs=[0, 1, 1, 1], nodes_missing_value_tracks_true=[0, 1, 0, 0],
        leaf_targetids=[0, 1, 0, 1, 1, 0], leaf_weights=np.array([1.0, 2.0, 3.0, 4.0, 0.5, -1.0], np.float32),
        tree_roots=[0, 3], n_targets=2,
    )
    for aggregate in range(4):
        check("TreeEnsemble", 5, [x], oracle="reference", aggregate_function=aggregate, **attrs)


def test_vectorised_and_jittable():
    # One program walks all trees: the jaxpr holds one loop, whatever the number of trees.
    rng = np.random.default_rng(1)
    small = random_forest(rng, n_trees=2, n_features=3, n_targets=1, ids="target")
    large = random_forest(rng, n_trees=40, n_features=3, n_targets=1, ids="target")
    x = features(rng, 8, 3)

    def size(attrs):
        f = lambda x: ml_trees.tree_ensemble_regressor(x, n_targets=1, **SCHEMA_DEFAULTS, **attrs)  # noqa: E731
        jaxpr = jax.make_jaxpr(f)(jnp.asarray(x))
        return len(jaxpr.eqns)

    assert size(small) == size(large)
    got = jax.jit(lambda x: ml_trees.tree_ensemble_regressor(x, n_targets=1, **SCHEMA_DEFAULTS, **large))(x)
    assert got.shape == (8, 1)


def test_cycle_is_refused():
    attrs = dict(nodes_treeids=[0, 0], nodes_nodeids=[0, 1], nodes_featureids=[0, 0], nodes_modes=["BRANCH_LEQ"] * 2,
                 nodes_values=[0.0, 0.0], nodes_truenodeids=[1, 0], nodes_falsenodeids=[1, 0],
                 target_treeids=[0], target_nodeids=[1], target_ids=[0], target_weights=[1.0])
    with pytest.raises(ValueError, match="cycle"):
        ml_trees.tree_ensemble_regressor(np.zeros((1, 1), np.float32), n_targets=1, **SCHEMA_DEFAULTS, **attrs)
