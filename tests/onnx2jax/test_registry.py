"""The op registry against ONNX's own schemas."""

import onnx.defs
import pytest

from onnx2jax.ops.registry import register, registered


# onnxruntime's contrib ops, which ONNX has no schemas for: all of com.microsoft, and these in the default domain.
_ONNXRUNTIME_DEFAULT_DOMAIN = {"SimplifiedLayerNormalization"}


def test_every_registered_version_is_a_real_schema_version():
    real = {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}
    onnxruntime_only = {
        k for k in registered() if k.domain == "com.microsoft" or k.op_type in _ONNXRUNTIME_DEFAULT_DOMAIN
    }
    assert not {(k.domain, k.op_type, k.since_version) for k in onnxruntime_only} & real
    bogus = sorted(k for k in registered() - onnxruntime_only if (k.domain, k.op_type, k.since_version) not in real)
    assert not bogus, f"registered versions that ONNX does not define: {bogus}"


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register("Add", 7)(lambda a, b: a + b)


# The sharding rules cover these ops although the op registry does not record them as elementwise:
RULE_ONLY_UNARY = {
    # Their output keeps the input's layout, so the unary rule passes the spec through; but they are
    # not elementwise: per-axis and blocked scales and zero points lie along an axis of the input.
    "QuantizeLinear",
    "DequantizeLinear",
}


def _registered_with(predicate, domain: str | None = None) -> set[str]:
    from onnx2jax.ops.registry import ops_with

    return set(ops_with(predicate, domain))


def test_registry_and_sharding_rules_agree_on_elementwise_ops():
    from sharding.rules import broadcast, unary

    registered_unary = _registered_with(lambda f: f.elementwise == "unary", domain="")
    registered_broadcast = _registered_with(lambda f: f.elementwise == "broadcast", domain="")
    assert registered_unary == set(unary.OPS) - RULE_ONLY_UNARY
    assert registered_broadcast == set(broadcast.OPS)


def test_contrib_ops_have_their_own_facts_and_the_decoder_ops_have_rules():
    """onnxruntime's contrib ops: their facts come from op_facts' contrib tables (a com.microsoft Gelu is
    not the default domain's by name alone); the sharding rules cover the model builder's decoder ops, none
    of them elementwise, and no elementwise contrib op; SimplifiedLayerNormalization (onnxruntime's, in the
    default domain) is a normalization with a rule and no fact."""
    from sharding.op_facts import CONTRIB_BROADCAST_ELEMENTWISE, CONTRIB_DOMAIN, CONTRIB_UNARY_ELEMENTWISE
    from sharding.rules import contrib_normalization, rule_for

    contrib = {k.op_type for k in registered() if k.domain == CONTRIB_DOMAIN}
    assert CONTRIB_UNARY_ELEMENTWISE | CONTRIB_BROADCAST_ELEMENTWISE <= contrib
    assert _registered_with(lambda f: f.elementwise == "unary", domain=CONTRIB_DOMAIN) == CONTRIB_UNARY_ELEMENTWISE
    assert _registered_with(lambda f: f.elementwise == "broadcast", domain=CONTRIB_DOMAIN) == CONTRIB_BROADCAST_ELEMENTWISE
    ruled = {op for op in contrib if rule_for(op, CONTRIB_DOMAIN) is not None}
    decoder = {"GroupQueryAttention", "RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "MatMulNBits"}
    assert ruled == decoder
    assert not ruled & (CONTRIB_UNARY_ELEMENTWISE | CONTRIB_BROADCAST_ELEMENTWISE)
    assert "SimplifiedLayerNormalization" not in _registered_with(lambda f: f != f.__class__())
    assert rule_for("SimplifiedLayerNormalization") is contrib_normalization.RULES[0]


def test_registry_and_sharding_rules_agree_on_reductions():
    from sharding.op_facts import REDUCTIONS
    from sharding.rules import reduction

    assert set(reduction.REDUCE) == set(REDUCTIONS)


def test_every_op_the_facts_name_is_registered():
    from sharding.op_facts import named_ops

    known = {key.op_type for key in registered() if key.domain in ("", "ai.onnx.ml")}
    assert not named_ops() - known, f"op facts for unregistered ops: {sorted(named_ops() - known)}"


def test_shape_readers_and_data_dependent_ops_are_recorded_on_their_implementations():
    from sharding.op_facts import DATA_DEPENDENT, SHAPE_READERS, VARIABLE_OUTPUTS

    assert _registered_with(lambda f: f.shape_reader) == set(SHAPE_READERS)
    assert _registered_with(lambda f: f.data_dependent) == set(DATA_DEPENDENT) == set(VARIABLE_OUTPUTS)


def _schema_at(key):
    try:
        schema = onnx.defs.get_schema(key.op_type, key.since_version, key.domain)
    except onnx.defs.SchemaError:
        return None
    return schema if schema.since_version == key.since_version else None


def test_implementations_repeat_no_schema_default():
    """Attribute defaults come from the schemas (graph_runner.node_attributes); a Python default
    that every registered version's schema also gives is a second copy that can drift. Ops without
    an ONNX schema (contrib domains) keep theirs."""
    import collections
    import inspect

    from onnx2jax.ops.registry import lookup

    versions = collections.defaultdict(list)
    for key in registered():
        impl = lookup(key.domain, key.op_type, key.since_version)
        versions[impl.fn].append(key)
    repeated = []
    for fn, keys in versions.items():
        schemas = [_schema_at(key) for key in keys]
        if any(schema is None for schema in schemas):
            continue
        for param in inspect.signature(fn).parameters.values():
            if param.kind is not param.KEYWORD_ONLY or param.default is param.empty:
                continue
            if all(
                param.name in s.attributes
                and s.attributes[param.name].default_value.type != onnx.AttributeProto.UNDEFINED
                for s in schemas
            ):
                repeated.append(f"{fn.__module__}.{fn.__qualname__}: {param.name}={param.default!r}")
    assert not repeated, "defaults the schema already gives:\n" + "\n".join(sorted(repeated))
