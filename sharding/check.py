"""Checking a whole model's sharding annotations: structure, then the op rules.

`check` runs `sharding.validate.validate_model` (is every annotation well
formed and does it fit its tensor and configuration?) and then `infer` (does
every op accept its input specs?), and returns every diagnostic of both in one
list: model-level first, then node by node. Errors mean the annotations
cannot run as written; warnings mean something was not checked; notes are
reshards and collectives, for information.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sharding.codes import ANNOTATION_INVALID, SHAPE_INFERENCE_FAILED
from sharding.diagnostics import Diagnostic
from sharding.infer import Inference
from sharding.stage_infer import infer
from sharding.model_arg import ModelArg, as_model_proto
from sharding.validate import validate_model


def check(
    model: ModelArg,
    configuration: str | None = None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
) -> list[Diagnostic]:
    """Every problem of the model's multi-device annotations, in one pass.

    Args:
        model: The model (a ModelProto, a path, bytes or an onnx_ir.Model); not modified.
        configuration: The device configuration to check; by default the
            model's first.
        input_shapes: Concrete dims of model inputs, for rules that need sizes.
        unsupported: Severity of annotated ops without a rule (``"warning"``
            or ``"error"``).

    Returns:
        The diagnostics; no diagnostic of severity ``error`` means the
        annotations are valid.

    Example:
        >>> errors = [d for d in check(model) if d.severity == "error"]  # doctest: +SKIP
        >>> print(errors[0])  # doctest: +SKIP
        error[k-sharding-mismatch] node 'mm' (MatMul), tensor 'W', axis 0: ...
    """
    return check_and_infer(
        model, configuration, input_shapes=input_shapes, unsupported=unsupported
    )[0]


def check_and_infer(
    model: ModelArg,
    configuration: str | None = None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
) -> tuple[list[Diagnostic], Inference]:
    """`check`'s diagnostics, and the `Inference` they come with (for ``explain``).

    The structural validation (`sharding.validate.validate_model`, the same
    one ``onnx2jax.compile`` runs) comes first, then the op rules.
    """
    model = as_model_proto(model)
    inference = infer(model, configuration, input_shapes=input_shapes, unsupported=unsupported)
    structural = validate_model(model, input_shapes=input_shapes)
    return merge(structural, inference.diagnostics), inference


def merge(structural: Sequence[Diagnostic], semantic: Sequence[Diagnostic]) -> list[Diagnostic]:
    """Structural diagnostics, then the rules' ones that do not repeat them."""
    broken = {d.node for d in structural if d.severity == "error"}
    codes = {(d.code, d.node) for d in structural}
    result = list(structural)
    for d in semantic:
        if (d.code, d.node) in codes or (d.code == SHAPE_INFERENCE_FAILED and (SHAPE_INFERENCE_FAILED, None) in codes):
            continue
        if d.code == ANNOTATION_INVALID and d.node in broken:
            continue
        result.append(d)
    return result
