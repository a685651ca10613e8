"""Shared helpers for the op tests: one-node ONNX models, run through onnx2jax and an oracle.

A test passes its node's inputs by position as ``arrays`` (None omits one). Each input is
either a graph input (fed at run time), or static:

* ``inits=(i, ...)``: those positions become graph initializers. onnx2jax makes float
  initializers traced parameters (small non-float ones, and any that set a shape, are folded).
* ``consts=(i, ...)``: those positions become Constant nodes, whose values are always known
  while tracing. Use these where a test relies on a static float input.

Each test file binds its own defaults with ``functools.partial`` (tolerances, oracle, how
outputs are typed and compared), so that the variant a file checks is stated in one line.
"""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnx.shape_inference
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

from onnx2jax.translate import translate


def single_node_model(
    op,
    opset,
    arrays=(),
    *,
    inits=(),
    consts=(),
    n_out=1,
    domain="",
    ai_onnx_opset=26,
    output_type=None,
    infer_shapes=False,
    trim=False,
    **attrs,
):
    """(model, feeds): one ``op`` node on inputs x0, x1, ... and outputs y0, y1, ...

    ``inits``/``consts``: positions that become initializers / Constant nodes (see the module
    docstring); the rest are graph inputs, in ``feeds`` in position order. ``domain``: the node's
    domain, imported at ``opset`` next to ai.onnx at ``ai_onnx_opset``. ``output_type``: an ONNX
    element type for every output (else untyped). ``infer_shapes``: run ONNX shape inference on
    the model (typing its outputs). ``trim``: drop trailing omitted inputs from the node.
    """
    inits, consts = set(inits), set(consts)
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    present = [(i, n, a) for i, (n, a) in enumerate(zip(names, arrays)) if a is not None]
    feeds = {n: a for i, n, a in present if i not in inits and i not in consts}
    initializers = [onnx.numpy_helper.from_array(a, n) for i, n, a in present if i in inits]
    nodes = [
        oh.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(np.asarray(a), n))
        for i, n, a in present
        if i in consts
    ]
    if trim:
        while names and not names[-1]:
            names.pop()
    outputs = [f"y{i}" for i in range(n_out)]
    nodes.append(oh.make_node(op, names, outputs, domain=domain, **attrs))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [
            oh.make_empty_tensor_value_info(o) if output_type is None else oh.make_tensor_value_info(o, output_type, None)
            for o in outputs
        ],
        initializers,
    )
    opsets = [oh.make_opsetid("", opset)]
    if domain:
        opsets = [oh.make_opsetid("", ai_onnx_opset), oh.make_opsetid(domain, opset)]
    model = oh.make_model(graph, opset_imports=opsets, ir_version=10)
    if infer_shapes:
        model = onnx.shape_inference.infer_shapes(model)
    return model, feeds


def run(op, opset, arrays=(), **kwargs):
    """onnx2jax's outputs (as numpy arrays) for ``single_node_model(op, opset, arrays, **kwargs)``."""
    model, feeds = single_node_model(op, opset, arrays, **kwargs)
    return [np.asarray(o) for o in translate(model)(*feeds.values())]


def check(
    op,
    opset,
    arrays=(),
    *,
    rtol=1e-6,
    atol=1e-6,
    oracle="ort",
    outputs="oracle",
    count="zip",
    compare="allclose64",
    **kwargs,
):
    """``op`` through onnx2jax and an oracle: same dtypes, same shapes, values within tolerance.

    ``oracle``: "ort" (onnxruntime, CPUExecutionProvider) or "reference" (ONNX's ReferenceEvaluator).
    ``outputs``: how the model's outputs are typed for onnx2jax, as exporters write them:
    "oracle" (dtype and shape copied from the oracle's results), "inferred" (ONNX shape
    inference, before the oracle runs), or None (as built).
    ``count``: "zip" (compare the outputs both produce), "at_least" (onnx2jax produces no fewer
    outputs than the oracle) or "equal" (the same number).
    ``compare``: "allclose64" (assert_allclose on both cast to float64), "allclose" (on the
    arrays as they are) or "equal" (assert_array_equal: exact; rtol and atol unused).
    Other keywords go to ``single_node_model`` (inputs, outputs, domain) or the node (attributes).
    """
    if outputs == "inferred":
        kwargs["infer_shapes"] = True
    model, feeds = single_node_model(op, opset, arrays, **kwargs)
    if oracle == "ort":
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
    elif oracle == "reference":
        expected = ReferenceEvaluator(model).run(None, feeds)
    else:
        raise ValueError(f"unknown oracle {oracle!r}")
    if outputs == "oracle":
        for info, e in zip(model.graph.output, map(np.asarray, expected)):
            info.CopyFrom(oh.make_tensor_value_info(info.name, oh.np_dtype_to_tensor_dtype(e.dtype), e.shape))
    actual = translate(model)(*feeds.values())
    assert_outputs(expected, actual, rtol=rtol, atol=atol, count=count, compare=compare)


def check_model(model, feeds, *, rtol=1e-6, atol=1e-6, count="zip", compare="allclose64"):
    """A whole ``model`` through onnx2jax and onnxruntime, inputs fed by name; see ``check``."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    actual = translate(model)(**feeds)
    assert_outputs(expected, actual, rtol=rtol, atol=atol, count=count, compare=compare)


def assert_outputs(expected, actual, *, rtol, atol, count="zip", compare="allclose64"):
    """The oracle's outputs against onnx2jax's: ``count`` and ``compare`` as in ``check``.

    A sequence output (a list) must be a list of the same length, compared element by element.
    """
    if count == "at_least":
        assert len(actual) >= len(expected), (len(actual), len(expected))
    elif count == "equal":
        assert len(actual) == len(expected), (len(actual), len(expected))
    else:
        assert count == "zip", count
    for e, a in zip(expected, actual):
        _assert_same(e, a, rtol, atol, compare)


def _assert_same(e, a, rtol, atol, compare):
    if isinstance(e, list):
        assert isinstance(a, list) and len(a) == len(e), (type(a), len(e))
        for x, y in zip(e, a):
            _assert_same(x, y, rtol, atol, compare)
        return
    e, a = np.asarray(e), np.asarray(a)
    assert a.dtype == e.dtype, (a.dtype, e.dtype)
    assert a.shape == e.shape, (a.shape, e.shape)
    if compare == "allclose64":
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
    elif compare == "allclose":
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    else:
        assert compare == "equal", compare
        np.testing.assert_array_equal(a, e)


def normal_arrays(rng):
    """A maker of standard-normal arrays (times ``scale``) drawing from ``rng``; each test file keeps its own."""

    def normal(*shape, dtype=np.float32, scale=None):
        x = rng.standard_normal(shape)
        return (x if scale is None else x * scale).astype(dtype)  # x * scale: a numpy scalar if shape is ()

    return normal


def integer_arrays(rng):
    """A maker of random integer arrays in [low, high) drawing from ``rng``; each test file keeps its own."""

    def integers(*shape, dtype=np.int32, low=-20, high=20):
        return rng.integers(low, high, shape).astype(dtype)

    return integers


def int_values(*values, dtype=np.int64):
    """A small array of given values (int64 by default: shapes, axes, indices)."""
    return np.asarray(values, dtype=dtype)


def runtime_choice(output: str, cond: str, then_name: str, else_name: str) -> onnx.NodeProto:
    """An If node picking one of two outer tensors on a runtime bool: its output is traced.

    Graph inputs that set shapes are folded in as constants; a value that
    comes out of a subgraph op stays a runtime value, which is how the tests
    reach the errors for values that must be known while tracing.
    """

    def branch(name: str, source: str) -> onnx.GraphProto:
        return oh.make_graph([oh.make_node("Identity", [source], [f"{name}_out"])], name, [], [oh.make_empty_tensor_value_info(f"{name}_out")])

    return oh.make_node(
        "If", [cond], [output], name=f"choose_{output}",
        then_branch=branch(f"then_{output}", then_name), else_branch=branch(f"else_{output}", else_name),
    )
