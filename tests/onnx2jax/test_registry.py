"""The op registry against ONNX's own schemas."""

import onnx.defs
import pytest

from onnx2jax.ops.registry import register, registered


def test_every_registered_version_is_a_real_schema_version():
    real = {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}
    bogus = sorted(k for k in registered() if (k.domain, k.op_type, k.since_version) not in real)
    assert not bogus, f"registered versions that ONNX does not define: {bogus}"


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register("Add", 7)(lambda a, b: a + b)
