"""Random tree ensembles as ai.onnx.ml attributes, for the tree tests."""

import numpy as np

MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")


def random_forest(rng, *, n_trees, n_features, n_targets, max_depth=4, modes=MODES, ids="class",
                  targets_per_leaf=None, missing=True, shuffle=True):
    """TreeEnsembleClassifier/Regressor node and leaf attributes for ``n_trees`` random trees.

    Leaves name ``targets_per_leaf`` targets (all when None) drawn from ``range(n_targets)``;
    node order within a tree is shuffled (roots stay first), as exporters need not sort.
    """
    nodes = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values", "truenodeids",
                             "falsenodeids", "missing_value_tracks_true")}
    leaves = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for tree in range(n_trees):
        rows = []

        def grow(depth):
            node = len(rows)
            rows.append(None)
            if depth == max_depth or (depth > 0 and rng.random() < 0.3):
                rows[node] = ("LEAF",)
                return node
            true_child = grow(depth + 1)
            false_child = grow(depth + 1)
            rows[node] = (str(rng.choice(modes)), int(rng.integers(n_features)),
                          float(np.float32(round(rng.normal(), 1))), true_child, false_child,
                          int(missing and rng.random() < 0.3))
            return node

        grow(0)
        ids_map = np.arange(len(rows))
        if shuffle:
            ids_map[1:] = 1 + rng.permutation(len(rows) - 1)
        for node in [0] + list(rng.permutation(np.arange(1, len(rows)))):
            row = rows[node]
            nodes["treeids"].append(tree)
            nodes["nodeids"].append(int(ids_map[node]))
            if row[0] == "LEAF":
                nodes["modes"].append("LEAF")
                nodes["featureids"].append(0)
                nodes["values"].append(0.0)
                nodes["truenodeids"].append(0)
                nodes["falsenodeids"].append(0)
                nodes["missing_value_tracks_true"].append(0)
                count = n_targets if targets_per_leaf is None else targets_per_leaf
                for target in rng.choice(n_targets, size=min(count, n_targets), replace=False):
                    leaves["treeids"].append(tree)
                    leaves["nodeids"].append(int(ids_map[node]))
                    leaves["ids"].append(int(target))
                    leaves["weights"].append(float(np.float32(round(rng.normal(), 2))))
            else:
                mode, feature, value, t, f, m = row
                nodes["modes"].append(mode)
                nodes["featureids"].append(feature)
                nodes["values"].append(value)
                nodes["truenodeids"].append(int(ids_map[t]))
                nodes["falsenodeids"].append(int(ids_map[f]))
                nodes["missing_value_tracks_true"].append(m)
    attrs = {f"nodes_{k}": v for k, v in nodes.items()}
    attrs.update({f"{ids}_{k}": v for k, v in leaves.items()})
    return attrs


def features(rng, n_rows, n_features, nan=True):
    """Rows drawn around the thresholds (rounded to hit EQ/NEQ splits), some NaN."""
    x = rng.normal(size=(n_rows, n_features)).round(1).astype(np.float32)
    if nan:
        x[rng.random(x.shape) < 0.1] = np.nan
    return x
