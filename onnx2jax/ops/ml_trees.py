"""ai.onnx.ml tree ensembles: TreeEnsembleClassifier, TreeEnsembleRegressor (1, 3), TreeEnsemble (5).

Every tree of the ensemble is walked at once, as array code. While tracing,
the node attributes become one :class:`Forest`: flat arrays over all nodes
of all trees (global node index), leaves pointing at themselves, and a dense
``[nodes, targets]`` matrix of leaf weights. At run time a ``[N, trees]``
array of current nodes starts at the roots and takes ``depth`` steps of
gathers and comparisons (a ``lax.fori_loop``); then each row gathers its
leaves' weights and aggregates them over the trees. No Python loop runs
per tree or per row, and the program's size does not grow with the forest.

Worked example: two trees, tree 0 = node 0 (x[1] <= 0.5 ? node 1 : node 2),
tree 1 = a single leaf, node 3. ``roots = [0, 3]``, ``depth = 1``. For a row
with x[1] = 0.2 the walk goes ``[0, 3] -> [1, 3]`` and the row's score is
``weights[1] + weights[3]``.

Semantics follow onnxruntime's tree kernels (``tree_ensemble_aggregator.h``):
a comparison is true, or NaN with ``missing_value_tracks_true``; a target
that no reached leaf names has no score (MIN/MAX ignore it, the classifier's
argmax skips it), and the classifier's binary cases (one class's weights,
base values, ``[1 - p, p]`` or ``[-s, s]`` scores) are reproduced exactly.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.ml_common import ML, as_matrix, class_labels, logistic, pick_labels, post_transform, probit
from onnx2jax.ops.registry import register

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER", "LEAF")
LEAF = _MODES.index("LEAF")
MEMBER = _MODES.index("BRANCH_MEMBER")


@dataclasses.dataclass(frozen=True)
class Forest:
    """All trees' nodes in flat arrays, indexed by global node number.

    Attributes:
      roots: [T] the root node of each tree.
      feature, threshold, mode: [M] what each node compares (mode: an index into ``_MODES``).
      true_next, false_next: [M] the next node; a leaf points at itself.
      missing_true: [M] whether NaN takes the true branch.
      members: [M, K] each BRANCH_MEMBER node's set, NaN-padded (None if there is none).
      weights, has_weight: [M, C] each leaf's weight per target, and whether it names the target.
      depth: the most comparisons on any root-to-leaf path.
    """

    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    mode: np.ndarray
    true_next: np.ndarray
    false_next: np.ndarray
    missing_true: np.ndarray
    members: np.ndarray | None
    weights: np.ndarray
    has_weight: np.ndarray
    depth: int

    @property
    def n_trees(self) -> int:
        return len(self.roots)


def _depth(roots: np.ndarray, true_next: np.ndarray, false_next: np.ndarray, leaf: np.ndarray, op: str) -> int:
    """The longest root-to-leaf path, walking every tree level by level (a cycle is an error)."""
    frontier, depth = np.unique(roots), 0
    while True:
        frontier = frontier[~leaf[frontier]]
        if not frontier.size:
            return depth
        depth += 1
        if depth > len(leaf):
            raise ValueError(f"{op}: the nodes form a cycle, not trees")
        frontier = np.unique(np.concatenate([true_next[frontier], false_next[frontier]]))


def _legacy_forest(attrs: dict, n_targets: int, ids: str, op: str) -> Forest:
    """A Forest from TreeEnsembleClassifier/Regressor attributes (``ids``: "class" or "target")."""
    tree_ids = np.asarray(attrs["nodes_treeids"], np.int64)
    node_ids = np.asarray(attrs["nodes_nodeids"], np.int64)
    position = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids.tolist(), node_ids.tolist()))}
    if len(position) != len(tree_ids):
        raise ValueError(f"{op}: a (tree id, node id) pair appears twice")
    modes = np.array([_MODES.index(m) for m in attrs["nodes_modes"]], np.int8)
    leaf = modes == LEAF

    def follow(children: str) -> np.ndarray:
        out = np.arange(len(tree_ids))
        for i in np.flatnonzero(~leaf):
            key = (int(tree_ids[i]), int(attrs[children][i]))
            if key not in position:
                raise ValueError(f"{op}: node {int(node_ids[i])} of tree {key[0]} points at missing node {key[1]}")
            out[i] = position[key]
        return out

    values = attrs.get("nodes_values_as_tensor")
    values = np.asarray(values) if values is not None else np.asarray(attrs.get("nodes_values") or np.zeros(len(tree_ids)), np.float32)
    missing = np.zeros(len(tree_ids), bool)
    if attrs.get("nodes_missing_value_tracks_true"):
        missing = np.asarray(attrs["nodes_missing_value_tracks_true"], bool)
    weights_attr = attrs.get(f"{ids}_weights_as_tensor")
    if weights_attr is not None:
        leaf_weights = np.asarray(weights_attr).reshape(-1)
    else:
        leaf_weights = np.asarray(attrs.get(f"{ids}_weights") or (), np.float32)
    weights = np.zeros((len(tree_ids), n_targets), leaf_weights.dtype)
    has = np.zeros((len(tree_ids), n_targets), bool)
    for t, n, c, w in zip(attrs[f"{ids}_treeids"], attrs[f"{ids}_nodeids"], attrs[f"{ids}_ids"], leaf_weights.tolist()):
        if (t, n) not in position or not 0 <= c < n_targets:
            raise ValueError(f"{op}: a weight names tree {t} node {n} target {c}, which does not exist")
        weights[position[t, n], c] += w
        has[position[t, n], c] = True
    roots = np.array([min(i for i, t in enumerate(tree_ids.tolist()) if t == tree) for tree in np.unique(tree_ids)])
    true_next, false_next = follow("nodes_truenodeids"), follow("nodes_falsenodeids")
    return Forest(
        roots, np.asarray(attrs["nodes_featureids"], np.int32), values, modes, true_next, false_next, missing, None,
        weights, has,
        _depth(roots, true_next, false_next, leaf, op),
    )


def _walk(forest: Forest, x: jax.Array) -> jax.Array:
    """[N, T] the leaf each row reaches in each tree."""
    threshold = jnp.asarray(forest.threshold.astype(x.dtype))
    feature, mode = jnp.asarray(forest.feature), jnp.asarray(forest.mode)
    true_next = jnp.asarray(forest.true_next.astype(np.int32))
    false_next = jnp.asarray(forest.false_next.astype(np.int32))
    missing = jnp.asarray(forest.missing_true)
    branch_modes = sorted(set(forest.mode[forest.mode != LEAF].tolist()))
    members = None if forest.members is None else jnp.asarray(forest.members.astype(x.dtype))

    def compare(v, t, node):
        if len(branch_modes) == 1 and branch_modes[0] != MEMBER:  # the usual case: one comparison for all
            return _compare(branch_modes[0], v, t, members, node)
        m = mode[node]
        result = jnp.zeros(v.shape, bool)
        for code in branch_modes:
            result = jnp.where(m == code, _compare(code, v, t, members, node), result)
        return result

    def step(_, node):
        v = jnp.take_along_axis(x, feature[node], axis=1)
        go_true = compare(v, threshold[node], node) | (missing[node] & jnp.isnan(v))
        return jnp.where(go_true, true_next[node], false_next[node])

    start = jnp.broadcast_to(jnp.asarray(forest.roots, jnp.int32), (x.shape[0], forest.n_trees))
    return jax.lax.fori_loop(0, forest.depth, step, start)


def _compare(code: int, v, t, members, node):
    if code == 0:
        return v <= t
    if code == 1:
        return v < t
    if code == 2:
        return v >= t
    if code == 3:
        return v > t
    if code == 4:
        return v == t
    if code == 5:
        return v != t
    return jnp.any(v[..., None] == members[node], axis=-1)


def _leaf_sums(forest: Forest, x: jax.Array, aggregate: str):
    """(scores [N, C], has [N, C]): the leaves' weights aggregated over the trees, and which targets any leaf named."""
    leaves = _walk(forest, x)
    weights = jnp.asarray(forest.weights)[leaves]  # [N, T, C]
    has = jnp.asarray(forest.has_weight)[leaves]
    named = jnp.any(has, axis=1)
    if aggregate in ("SUM", "AVERAGE"):
        scores = jnp.sum(jnp.where(has, weights, 0), axis=1)
        if aggregate == "AVERAGE":
            scores = scores / forest.n_trees
    elif aggregate == "MIN":
        scores = jnp.where(named, jnp.min(jnp.where(has, weights, jnp.inf), axis=1), 0)
    elif aggregate == "MAX":
        scores = jnp.where(named, jnp.max(jnp.where(has, weights, -jnp.inf), axis=1), 0)
    else:
        raise ValueError(f"unknown aggregate_function {aggregate!r}")
    return scores, named


def _input(x, forest: Forest, op: str) -> jax.Array:
    # Comparisons in float64 only when the input or the thresholds are double (as onnxruntime).
    wide = jnp.asarray(x).dtype == jnp.float64 or forest.threshold.dtype == np.float64
    return as_matrix(x, op, jnp.float64 if wide else jnp.float32)


def _transform_targets(scores, transform: str):
    if scores.shape[1] == 1:  # one target: onnxruntime applies only PROBIT
        return probit(scores) if transform == "PROBIT" else scores
    return post_transform(scores, transform)


@register("TreeEnsembleRegressor", 1, 3, domain=ML)
def tree_ensemble_regressor(x, *, n_targets=None, aggregate_function, base_values=None,
                            base_values_as_tensor=None, post_transform, **attrs):
    """[N, n_targets] float32: the trees' leaf weights aggregated, plus ``base_values``."""
    n_targets = int(n_targets or 1)
    forest = _legacy_forest(attrs, n_targets, "target", "TreeEnsembleRegressor")
    scores, named = _leaf_sums(forest, _input(x, forest, "TreeEnsembleRegressor"), aggregate_function)
    base = _base(base_values, base_values_as_tensor)
    if base.size == n_targets:  # onnxruntime adds base values only when there is one per target,
        # and with several targets only to those that a reached leaf names (the others stay 0)
        scores = scores + base.astype(scores.dtype)
        if n_targets > 1:
            scores = jnp.where(named, scores, 0)
    return _transform_targets(scores, post_transform).astype(jnp.float32)


def _base(base_values, base_values_as_tensor) -> np.ndarray:
    if base_values_as_tensor is not None:
        return np.asarray(base_values_as_tensor).reshape(-1)
    return np.asarray(base_values or (), np.float32)


@register("TreeEnsembleClassifier", 1, 3, domain=ML)
def tree_ensemble_classifier(x, *, classlabels_int64s=None, classlabels_strings=None, base_values=None,
                             base_values_as_tensor=None, post_transform, **attrs):
    """(labels [N], scores [N, C] float32) of a tree classifier, as onnxruntime computes them."""
    labels = class_labels(classlabels_int64s, classlabels_strings, "TreeEnsembleClassifier")
    if len(labels) < 2:
        raise NotImplementedError("TreeEnsembleClassifier with a single class label has no defined scores")
    forest = _legacy_forest(attrs, len(labels), "class", "TreeEnsembleClassifier")
    sums, named = _leaf_sums(forest, _input(x, forest, "TreeEnsembleClassifier"), "SUM")
    base = _base(base_values, base_values_as_tensor).astype(sums.dtype)
    class_ids = set(attrs.get("class_ids") or ())
    weights = attrs.get("class_weights_as_tensor")
    weights = np.asarray(weights if weights is not None else attrs.get("class_weights") or ())
    if len(labels) > 2:
        index, scores = _multiclass(sums, named, base, post_transform)
    else:
        index, scores = _binary(sums, named, base, post_transform, len(class_ids) == 1, bool((weights >= 0).all()))
    return pick_labels(index, labels), scores.astype(jnp.float32)


def _multiclass(sums, named, base, transform: str):
    # Base values count as scores; the label is the first best class among those with a score.
    k = base.size
    if k:
        sums = sums.at[:, :k].add(base)
        named = named.at[:, :k].set(True)
    index = jnp.argmax(jnp.where(named, sums, -jnp.inf), axis=1)
    return index, post_transform(sums, transform)


def _binary(sums, named, base, transform: str, one_class_weights: bool, all_positive: bool):
    """onnxruntime's two-class case: which classes have a score decides the layout, row by row.

    As onnxruntime writes them, a class with no score is 0 before the
    post_transform, even where a base value was added to it.
    """
    s0, s1 = sums[:, 0], sums[:, 1]
    h0, h1 = named[:, 0], named[:, 1]
    add_second = -1  # onnxruntime's write_additional_scores
    if base.size == 2:
        p1 = jnp.where(h1, base[1] + s0, s1 + base[1])
        p0 = jnp.where(h1, -p1, s0 + base[0])
        two = jnp.ones_like(h1)
    elif base.size == 1:
        p0, p1, two = s0 + base[0], s1, h1
    else:
        p0, p1, two = s0, s1, h1
        add_second = 3
    positive = jnp.where(h1, p1, jnp.where(h0, p0, 0))
    cut = 0.0
    if one_class_weights:
        cut = 0.5 if all_positive else 0.0
        add_second = 0 if all_positive else 2
    index = (positive > cut).astype(jnp.int32)
    v0, v1 = jnp.where(h0, p0, 0), jnp.where(h1, p1, 0)
    pair = post_transform(jnp.stack([v0, v1], axis=1), transform)
    if transform == "PROBIT":
        single = [probit(v0), jnp.zeros_like(v0)]
    elif add_second in (0, 1):
        single = [1 - v0, v0]
    elif add_second in (2, 3):
        single = [logistic(-v0), logistic(v0)] if transform == "LOGISTIC" else [-v0, v0]
    else:
        single = [v0, jnp.zeros_like(v0)]
    return index, jnp.where(two[:, None], pair, jnp.stack(single, axis=1))


_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def _forest_5(attrs: dict) -> Forest:
    """A Forest from TreeEnsemble-5's attributes: nodes first, then leaves, in one index space."""
    modes = np.asarray(attrs["nodes_modes"], np.int64).reshape(-1)
    n_nodes = modes.size
    leaf_targets = np.asarray(attrs["leaf_targetids"], np.int64)
    leaf_weights = np.asarray(attrs["leaf_weights"]).reshape(-1)
    n_targets = int(attrs["n_targets"])
    true_ids = np.asarray(attrs["nodes_truenodeids"], np.int64) + n_nodes * np.asarray(attrs["nodes_trueleafs"], bool)
    false_ids = np.asarray(attrs["nodes_falsenodeids"], np.int64) + n_nodes * np.asarray(attrs["nodes_falseleafs"], bool)
    total = n_nodes + leaf_targets.size
    all_modes = np.concatenate([modes, np.full(leaf_targets.size, LEAF)]).astype(np.int8)
    missing = np.zeros(total, bool)
    if attrs.get("nodes_missing_value_tracks_true") is not None:
        missing[:n_nodes] = np.asarray(attrs["nodes_missing_value_tracks_true"], bool)
    members = None
    if (modes == MEMBER).any():
        sets = _member_sets(np.asarray(attrs["membership_values"]).reshape(-1), int((modes == MEMBER).sum()))
        width = max(len(s) for s in sets)
        members = np.full((total, width), np.nan)
        for node, values in zip(np.flatnonzero(modes == MEMBER), sets):
            members[node, : len(values)] = values
    weights = np.zeros((total, n_targets), leaf_weights.dtype)
    has = np.zeros((total, n_targets), bool)
    weights[n_nodes + np.arange(leaf_targets.size), leaf_targets] = leaf_weights
    has[n_nodes + np.arange(leaf_targets.size), leaf_targets] = True
    roots = np.asarray(attrs["tree_roots"], np.int64)
    true_next = np.concatenate([true_ids, n_nodes + np.arange(leaf_targets.size)])
    false_next = np.concatenate([false_ids, n_nodes + np.arange(leaf_targets.size)])
    splits = np.asarray(attrs["nodes_splits"]).reshape(-1)
    return Forest(
        roots, np.concatenate([np.asarray(attrs["nodes_featureids"], np.int32), np.zeros(leaf_targets.size, np.int32)]),
        np.concatenate([splits, np.zeros(leaf_targets.size, splits.dtype)]), all_modes, true_next, false_next, missing,
        members, weights, has, _depth(roots, true_next, false_next, all_modes == LEAF, "TreeEnsemble"),
    )


def _member_sets(values: np.ndarray, count: int) -> list[np.ndarray]:
    """The NaN-separated sets of ``membership_values``, one per BRANCH_MEMBER node in node order."""
    sets, current = [], []
    for v in values.tolist():
        if np.isnan(v):
            sets.append(np.asarray(current))
            current = []
        else:
            current.append(v)
    if current:
        sets.append(np.asarray(current))
    if len(sets) != count:
        raise ValueError(f"TreeEnsemble: {len(sets)} membership sets for {count} BRANCH_MEMBER nodes")
    return sets


@register("TreeEnsemble", 5, domain=ML)
def tree_ensemble(x, *, aggregate_function, post_transform, **attrs):
    """[N, n_targets] in x's dtype: TreeEnsemble-5, leaves and nodes in separate index spaces."""
    forest = _forest_5(attrs)
    x = jnp.asarray(x)
    aggregate = _AGGREGATES[int(aggregate_function)]
    scores, named = _leaf_sums(forest, as_matrix(x, "TreeEnsemble", x.dtype), aggregate)
    if aggregate in ("MIN", "MAX"):  # a target no leaf names keeps the fold's start, as ONNX's reference
        info = jnp.finfo(x.dtype)
        scores = jnp.where(named, scores, info.max if aggregate == "MIN" else info.min)
    return _transform_targets(scores, _TRANSFORMS[int(post_transform)]).astype(x.dtype)
