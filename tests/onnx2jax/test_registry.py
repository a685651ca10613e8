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
