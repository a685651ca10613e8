"""Make the torch-exported detection fixture in tests/data/detection/ (model, inputs, onnxruntime outputs).

Needs torch (CPU), which neither the library nor its tests import (use a separate venv):

    python scripts/make_detection_fixtures.py

A small detection head (Conv -> ReLU -> Conv -> 4 box channels and 1 score
channel per pixel -> NonMaxSuppression -> the kept boxes gathered and scaled)
exported with torch.onnx.export (TorchScript exporter, opset 17). torch has no
NonMaxSuppression of its own (torchvision's ``nms`` is an autograd Function
with an ONNX symbolic); the same construction is used here, so the graph is
what a torchvision detection export ends in. For each threshold setting
(``none``, ``some``, ``all`` boxes kept):

    tests/data/detection/head.onnx                  the model (x: [1, 3, h, w], iou [1], score_min [1])
    tests/data/detection/head.CASE.inputs.npz       the inputs, keyed by input name
    tests/data/detection/head.CASE.ort_outputs.npz  onnxruntime's outputs (CPU), keyed by output name
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "detection"
CASES = {"none": (0.5, 1.0), "some": (0.3, 0.5), "all": (1.0, -1.0)}  # (iou threshold, score threshold)


class NonMaxSuppression(torch.autograd.Function):
    """Exports as ONNX NonMaxSuppression (as torchvision.ops.nms does); its eager forward is a placeholder."""

    @staticmethod
    def forward(ctx, boxes, scores, max_boxes, iou, score_min):  # noqa: ARG004 - tracing only
        return torch.zeros((1, 3), dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_boxes, iou, score_min):
        return g.op("NonMaxSuppression", boxes, scores, max_boxes, iou, score_min)


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Conv2d(8, 5, 1)

    def forward(self, x, iou, score_min):
        flat = self.head(torch.relu(self.body(x))).flatten(2)  # [1, 5, h * w]
        boxes = flat[:, :4].transpose(1, 2).contiguous()  # [1, h * w, 4]
        scores = torch.sigmoid(flat[:, 4:5])  # [1, 1, h * w]
        selected = NonMaxSuppression.apply(boxes, scores, torch.tensor([100]), iou, score_min)
        return selected, boxes[0].index_select(0, selected[:, 2]) * 2.0


def main() -> None:
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(0).normal(size=(1, 3, 6, 6)).astype(np.float32)
    path = OUT / "head.onnx"
    torch.onnx.export(
        Head().eval(),
        (torch.from_numpy(x), torch.tensor([0.5]), torch.tensor([0.5])),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x", "iou", "score_min"],
        output_names=["selected", "kept_boxes"],
        dynamic_axes={"x": {2: "h", 3: "w"}, "selected": {0: "k"}, "kept_boxes": {0: "k"}},
    )
    onnx.checker.check_model(onnx.load(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for case, (iou, score_min) in CASES.items():
        feeds = {"x": x, "iou": np.array([iou], np.float32), "score_min": np.array([score_min], np.float32)}
        outputs = session.run(None, feeds)
        np.savez(OUT / f"head.{case}.inputs.npz", **feeds)
        np.savez(OUT / f"head.{case}.ort_outputs.npz", selected=outputs[0], kept_boxes=outputs[1])
        print(f"{case}: {len(outputs[0])} of 36 boxes kept")


if __name__ == "__main__":
    main()
