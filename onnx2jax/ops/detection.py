"""Object detection: NonMaxSuppression.

The number of selected boxes depends on the box and score values, and XLA needs
static output shapes, so NonMaxSuppression runs in numpy on inputs known while
tracing: constants, or, for boxes and scores computed at run time, on the host
between the jitted segments around it (:mod:`sharding.segments`). Traced boxes
or scores (``jax.jit(model.fn)``) are a clear error.
"""

from __future__ import annotations

import numpy as np

from onnx2jax.ops.registry import register


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """[..., 4] boxes -> (y_min, x_min, y_max, x_max), whatever the corner order."""
    if center_point_box:
        xc, yc, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    y_lo = np.maximum(box[0], others[:, 0])
    x_lo = np.maximum(box[1], others[:, 1])
    y_hi = np.minimum(box[2], others[:, 2])
    x_hi = np.minimum(box[3], others[:, 3])
    inter = np.clip(y_hi - y_lo, 0, None) * np.clip(x_hi - x_lo, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where((inter > 0) & (area > 0) & (areas > 0) & (union > 0), inter / union, 0.0)
    return iou


@register("NonMaxSuppression", 10, 11)
def non_max_suppression(
    boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None, *, center_point_box
):
    given = [v for v in (boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold) if v is not None]
    if not all(isinstance(v, (np.ndarray, np.generic)) for v in given):
        raise ValueError(
            "NonMaxSuppression's output length depends on the box and score values, which XLA cannot "
            "express; it only runs when boxes, scores and thresholds are known while tracing (constants)"
        )
    limit = 0 if max_output_boxes_per_class is None else max(int(np.asarray(max_output_boxes_per_class).ravel()[0]), 0)
    iou_limit = 0.0 if iou_threshold is None else float(np.asarray(iou_threshold).ravel()[0])
    corners = _corners(np.asarray(boxes, np.float64), center_point_box)
    scores = np.asarray(scores)
    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            candidates = np.arange(s.shape[0])
            if score_threshold is not None:
                candidates = candidates[s > np.asarray(score_threshold).ravel()[0]]
            # Highest score first; equal scores keep the lower box index first.
            order = candidates[np.lexsort((candidates, -s[candidates]))]
            kept: list[int] = []
            for index in order:
                if len(kept) >= limit:
                    break
                if not kept or not np.any(_iou(corners[b, index], corners[b, kept]) > iou_limit):
                    kept.append(int(index))
                    selected.append((b, c, int(index)))
    return np.asarray(selected, np.int64).reshape(-1, 3)
