"""Every diagnostic code, declared once: its name, default severity, one-line meaning and the table
that documents it (after mypy's ``errorcodes.py``).

Emitters name codes through this module's constants (``codes.SHAPE_UNKNOWN``), never as string
literals, and `sharding.diagnostics.Diagnostic` refuses a code that is not registered here, so a
new code cannot be emitted without being declared. The user-facing tables of codes are the
docstrings of `sharding.validate` (structural problems) and `sharding.infer` (everything else);
``tests/sharding/test_codes.py`` checks that each table lists exactly the codes registered for it,
with their default severities.

A code's severity at an emitter may differ from its default where the docs say so (``strict``
validation makes some warnings errors; ``unsupported=`` makes ``unsupported-op`` an error; an
unknown shape that a spec needs at compile is an error).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

Severity = Literal["error", "warning", "note"]

_KEBAB = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclasses.dataclass(frozen=True)
class CodeInfo:
    """One registered code.

    Attributes:
        name: The kebab-case code, e.g. ``"axis-repeated"``.
        severity: Its default severity.
        description: What it means, in one line.
        documented_in: The module whose docstring table lists it.
    """

    name: str
    severity: Severity
    description: str
    documented_in: str


CODES: dict[str, CodeInfo] = {}
"""Every registered code, by name."""


def _code(name: str, severity: Severity, description: str, documented_in: str) -> str:
    if not _KEBAB.fullmatch(name):
        raise ValueError(f"a diagnostic code must be kebab-case, got {name!r}")
    if name in CODES:
        raise ValueError(f"diagnostic code {name!r} is registered twice")
    CODES[name] = CodeInfo(name, severity, description, documented_in)
    return name


def _validate(name: str, severity: Severity, description: str) -> str:
    return _code(name, severity, description, "sharding.validate")


def _infer(name: str, severity: Severity, description: str) -> str:
    return _code(name, severity, description, "sharding.infer")


# Structural problems (sharding.validate).
SHAPE_INFERENCE_FAILED = _validate("shape-inference-failed", "warning", "ONNX shape inference failed")
CONFIGURATION_INVALID = _validate("configuration-invalid", "error", "a configuration without name, devices...")
CONFIGURATION_REPEATED = _validate("configuration-repeated", "error", "two configurations (annotations) with one name")
NODE_NAME_MISSING = _validate("node-name-missing", "error", "an annotated node without a name")
NODE_NAME_REPEATED = _validate("node-name-repeated", "error", "two annotated nodes with one name")
UNKNOWN_CONFIGURATION = _validate("unknown-configuration", "error", "configuration_id missing or not defined")
TENSOR_NOT_IN_NODE = _validate("tensor-not-in-node", "error", "tensor_name not an input/output of the node")
SPEC_REPEATED = _validate("spec-repeated", "error", "two specs for one tensor in one annotation")
AXIS_MISSING = _validate("axis-missing", "error", "a sharded_dim without axis")
AXIS_OUT_OF_RANGE = _validate("axis-out-of-range", "error", "axis outside [-rank, rank)")
AXIS_REPEATED = _validate("axis-repeated", "error", "one axis sharded twice")
SHARDED_DIM_EMPTY = _validate("sharded-dim-empty", "error", "a sharded_dim without simple_sharding")
NUM_SHARDS_MISSING = _validate("num-shards-missing", "error", "a simple_sharding without num_shards")
NUM_SHARDS_INVALID = _validate("num-shards-invalid", "error", "num_shards < 1")
DIM_VALUE_INVALID = _validate("dim-value-invalid", "error", "a negative dim_value")
DIM_VALUE_MISMATCH = _validate("dim-value-mismatch", "error", "dim_value differs from the axis size")
DIM_PARAM_MISMATCH = _validate("dim-param-mismatch", "error", "dim_param differs from the axis's dim")
FUSED_SIZE_MISMATCH = _validate("fused-size-mismatch", "error", "sub-axis sizes do not multiply to the size")
FUSED_SIZE_UNKNOWN = _validate("fused-size-unknown", "error", "two sub-axes without dim_value")
SIZE_UNRESOLVED = _validate("size-unresolved", "note", "a size written on a symbolic axis, checked at a call")
FUSED_SIZE_UNRESOLVED = _validate("fused-size-unresolved", "note", "a fused axis of symbolic size, laid out at a call")
PIPELINE_STAGE_INVALID = _validate("pipeline-stage-invalid", "error", "a negative pipeline_stage")
SHARD_COUNT_MISMATCH = _validate("shard-count-mismatch", "error", "len(device) != product of num_shards")
DEVICE_OUT_OF_RANGE = _validate("device-out-of-range", "error", "a device id outside [0, num_devices)")
GROUP_KEY_MISSING = _validate("group-key-missing", "error", "a negative device entry with no group")
GROUP_KEY_NOT_NEGATIVE = _validate("group-key-not-negative", "error", "a group key >= 0")
GROUP_KEY_REPEATED = _validate("group-key-repeated", "error", "a group key defined twice")
GROUP_EMPTY = _validate("group-empty", "error", "a group with no device")
DEVICE_REPEATED = _validate("device-repeated", "error", "a device holding two shards of one tensor")

# Inference, rules, stages and compile-time layout (sharding.infer).
SHARDING_MISMATCH = _infer("sharding-mismatch", "error", "two inputs shard one axis differently")
K_SHARDING_MISMATCH = _infer("k-sharding-mismatch", "error", "MatMul-like: the K axes differ")
BROADCAST_AXIS_SHARDED = _infer("broadcast-axis-sharded", "error", "a broadcast size-1 axis is sharded")
EMPTY_INTERSECTION = _infer("empty-intersection", "error", "no device holds all shards an output needs")
SPATIAL_AXIS_SHARDED = _infer("spatial-axis-sharded", "error", "a conv, pool or resize spatial axis is sharded")
GROUP_SPLIT = _infer("group-split", "error", "a channel cut splits a conv's channel groups")
ATTENTION_AXIS_SHARDED = _infer("attention-axis-sharded", "error", "an attention sequence/head-size axis or rotary table is cut")
ATTENTION_HEADS_SPLIT = _infer("attention-heads-split", "error", "a cut splits attention heads or a packed q|k|v")
QUANTIZED_BLOCK_SPLIT = _infer("quantized-block-split", "error", "a cut splits a MatMulNBits quantisation block")
ANNOTATION_INVALID = _infer("annotation-invalid", "error", "an annotation cannot be read")
STAGE_INVALID = _infer("stage-invalid", "error", "pipeline stages cannot be placed on devices")
FUSED_AXIS_SIZE = _infer("fused-axis-size", "error", "a fused spec has no layout at the call's shapes")
UNSUPPORTED_OP = _infer("unsupported-op", "warning", "an annotated op with no rule (error on request)")
RESHAPE_UNSUPPORTED = _infer("reshape-unsupported", "warning", "a sharded axis cannot follow a reshape")
EINSUM_UNSUPPORTED = _infer("einsum-unsupported", "warning", "an Einsum outside the MatMul-like cases")
SHAPE_UNKNOWN = _infer("shape-unknown", "warning", "a rule (or a spec, at compile) lacks a shape it needs")
RULE_FAILED = _infer("rule-failed", "warning", "a rule raised (a bug): outputs unplaced")
RESHARD = _infer("reshard", "note", "a written spec differs: data moves (kind)")
COLLECTIVE = _infer("collective", "note", "the op itself combines shards (kind)")
NO_RULE = _infer("no-rule", "note", "sharded data enters an op with no rule")
CONFIGURATION_CHOSEN = _infer("configuration-chosen", "note", "several configurations; which was used")
PIPELINE_STAGE = _infer("pipeline-stage", "note", "one pipeline stage: its nodes, devices and sends")
