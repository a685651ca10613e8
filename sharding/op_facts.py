"""What each ONNX op is, as far as planning and translating need to know: one table, by op type.

This is the single source of the op facts that used to be kept as separate hand-written sets (and had
drifted): which ops are elementwise, which read only their input's shape, which have outputs whose
shape depends on values, which make 64-bit results, which draw random numbers; and the op families
several modules single out (the linear products, the normalizations). It lives in
``sharding/`` because the jax-free side needs it (partitioning into segments and stages, the Megatron
planner's walks) and ``sharding/`` never imports jax nor ``onnx2jax``. The translator side reads it
through the op registry: ``onnx2jax.ops.registry.register`` attaches an op's :class:`OpFacts` to each
implementation (``OpImpl.facts``; ``ops_with`` lists the ops with a given fact); the module-level
constants ``onnx2jax`` needs at import (``runtime.constraints``, ``graph_runner``) read this table
directly, so they do not depend on which op modules are loaded yet.

The tables are keyed by op type, as every consumer matches ``node.op_type`` today; they describe the
ONNX domains (default and ``ai.onnx.ml``). onnxruntime's contrib ops (``com.microsoft``) have their own
small tables, read by ``facts_of(op_type, domain)``, since a contrib op may share a default-domain name.
Attribute defaults are not kept here: they come from the ``onnx.defs`` schemas
(``graph_runner.node_attributes``); schema-less contrib ops keep their Python defaults.

The sharding rules (``sharding/rules``) keep their own lists of the ops each rule covers: a rule's
coverage is a decision of the rule, an op's semantics a fact of the op. ``tests/onnx2jax/test_registry.py``
checks that the two agree op by op, with the justified exceptions listed there.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping

UNARY_ELEMENTWISE = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Cast CastLike Ceil Celu Clip Cos Cosh
    Dropout Elu Erf Exp Floor Gelu HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not
    Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Swish Tan Tanh
    ThresholdedRelu
    """.split()
)
"""One tensor in, one value out per element, the output shaped like the input. Extra inputs are
scalars or give only a type (Clip's bounds, Dropout's ratio and training mode, CastLike's target);
Dropout's second output, the mask, is shaped like the input too."""

BROADCAST_ELEMENTWISE = frozenset(
    """
    Add And BitShift BitwiseAnd BitwiseOr BitwiseXor Div Equal Greater GreaterOrEqual Less
    LessOrEqual Max Mean Min Mod Mul Or Pow PRelu Sub Sum Where Xor
    """.split()
)
"""Several tensors in, combined element by element after numpy broadcasting."""

ELEMENTWISE = UNARY_ELEMENTWISE | BROADCAST_ELEMENTWISE

REDUCTIONS = frozenset(
    """
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
    ReduceSum ReduceSumSquare
    """.split()
)
"""Reductions over the axes their ``axes`` input or attribute names."""

SHAPE_READERS = frozenset({"Shape", "Size", "SequenceLength"})
"""Ops whose output depends on their input's shape (a sequence's length) only, never its values: a
walk along values (which tensors must be static, which are known from shapes alone) stops there."""

DATA_DEPENDENT: Mapping[str, tuple[int, ...] | None] = {
    "NonMaxSuppression": None,  # every input: boxes, scores and the thresholds
    "NonZero": (0,),
    "Unique": (0,),
    "Compress": (1,),  # the condition
}
"""Ops whose output shape depends on the values of these inputs (None: all of them)."""

VARIABLE_OUTPUTS: Mapping[str, tuple[int, ...]] = {
    "NonMaxSuppression": (0,),  # selected_indices: one row per kept box
    "NonZero": (0,),  # one column per nonzero element
    "Unique": (0, 1, 3),  # Y, indices, counts (inverse_indices has the input's length)
    "Compress": (0,),
}
"""Per data-dependent op, the outputs whose length depends on those values."""

INT64_RESULTS = frozenset(
    {
        "ArgMax", "ArgMin", "TopK", "NonZero", "Unique", "NonMaxSuppression", "Shape", "Size",
        # ai.onnx.ml: int64 labels, categories and one-hot indices
        "LinearClassifier", "TreeEnsembleClassifier", "SVMClassifier", "CategoryMapper", "LabelEncoder",
    }
)
"""Ops whose outputs (or one of them) are int64 whatever their inputs' types."""

RANDOM = frozenset(
    {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}
)
"""Ops whose outputs are random draws. Dropout is not one: in inference mode it is the identity, and
ONNX's reference fixes its draw in training mode."""

NONDETERMINISTIC = RANDOM | {"Dropout"}
"""Ops that are not functions of their inputs, so never recomputed from them (Dropout in training
mode draws its mask)."""

LINEAR_PRODUCTS = frozenset({"MatMul", "Gemm"})
"""The products of two matrices that carry a linear layer: MatMul, and Gemm (``transA``/``transB``,
``alpha``, ``beta`` and the added ``C`` are Gemm's own; planners check ``op_type == "Gemm"`` for them)."""

SOFTMAXES = frozenset({"Softmax", "LogSoftmax"})
"""Normalizations of one axis to a distribution (``axis``, default -1)."""

ONNX_LAYER_NORMS = frozenset({"LayerNormalization", "RMSNormalization"})
"""ONNX's normalizations over the trailing axes from ``axis`` (default -1), with a scale (and a bias)."""

LAYER_NORMS = ONNX_LAYER_NORMS | {"SimplifiedLayerNormalization"}
"""The layer normalizations of one input: ONNX's, and onnxruntime's RMS norm (SimplifiedLayerNormalization,
registered in the default domain), all over the trailing axes."""

SKIP_LAYER_NORMS = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
"""onnxruntime's contrib layer norms that first add a residual (``skip``) to their input."""

NORMALIZATIONS = LAYER_NORMS | SKIP_LAYER_NORMS | {
    "GroupNormalization", "InstanceNormalization", "BatchNormalization", "MeanVarianceNormalization",
    "LpNormalization",
}
"""Every op that normalizes a tensor by statistics of its own values (softmaxes apart: :data:`SOFTMAXES`)."""

CONTRIB_DOMAIN = "com.microsoft"
"""onnxruntime's contrib domain: its ops have no ONNX schema (so they keep their Python attribute defaults)."""

CONTRIB_UNARY_ELEMENTWISE = frozenset({"Gelu", "QuickGelu"})
"""Contrib ops with one tensor in and one value out per element (QuickGelu's ``alpha`` is an attribute)."""

CONTRIB_BROADCAST_ELEMENTWISE = frozenset({"BiasGelu", "FastGelu"})
"""Contrib ops that add a bias along the last axis (FastGelu's is optional), then act element by element.

The other contrib ops have no fact here: the skip and simplified layer norms are normalizations over
the last axis, RotaryEmbedding, GroupQueryAttention, MatMulNBits and GatherBlockQuantized mix elements.
The sharding rules (``sharding.rules.contrib_*``, ``rule_for(op, "com.microsoft")``) cover the decoder ops
the model builder writes: GroupQueryAttention, RotaryEmbedding, SkipLayerNormalization,
SkipSimplifiedLayerNormalization and MatMulNBits, none of them elementwise."""


@dataclasses.dataclass(frozen=True)
class OpFacts:
    """The facts of one op type (see the module's tables)."""

    elementwise: Literal["unary", "broadcast"] | None = None
    shape_reader: bool = False
    data_dependent: bool = False
    int64_results: bool = False
    random: bool = False


def facts_of(op_type: str, domain: str = "") -> OpFacts:
    """The facts the tables above record for ``op_type`` of ``domain`` (all false for an op they do not name).

    The ONNX domains (``""``, ``ai.onnx.ml``) read the main tables; onnxruntime's contrib domain reads
    its own, as its ops share names (``Gelu``) but not always semantics with the default domain's.
    """
    if domain == CONTRIB_DOMAIN:
        unary, broadcast = CONTRIB_UNARY_ELEMENTWISE, CONTRIB_BROADCAST_ELEMENTWISE
        if op_type in unary or op_type in broadcast:
            return OpFacts(elementwise="unary" if op_type in unary else "broadcast")
        return OpFacts()
    kind: Literal["unary", "broadcast"] | None = None
    if op_type in UNARY_ELEMENTWISE:
        kind = "unary"
    elif op_type in BROADCAST_ELEMENTWISE:
        kind = "broadcast"
    return OpFacts(
        elementwise=kind,
        shape_reader=op_type in SHAPE_READERS,
        data_dependent=op_type in DATA_DEPENDENT,
        int64_results=op_type in INT64_RESULTS,
        random=op_type in RANDOM,
    )


def named_ops() -> frozenset[str]:
    """Every op type of the ONNX domains some table names (each must be registered: tested)."""
    return (
        ELEMENTWISE | REDUCTIONS | SHAPE_READERS | frozenset(DATA_DEPENDENT) | INT64_RESULTS | NONDETERMINISTIC
    )
