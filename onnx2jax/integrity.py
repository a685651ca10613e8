"""What a loaded model must satisfy before anything reads its tensors or runs its graph.

A hostile or broken file must be refused by name (a :class:`ModelLoadError`
naming the tensor, node or field), never end in onnx's or numpy's own errors
or, worse, run:

- ``ir_version`` and the opsets of the domains onnx defines are ones this
  onnx knows (an opset from the future has ops we cannot know);
- every tensor embedded in the model (initializers, sparse initializers,
  Constant and other attribute tensors, in every graph and function) holds
  exactly as many values as its dims say, of a defined type;
- every graph is in SSA form: each tensor has one producer, and no node
  writes a graph input or an initializer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
import onnx.external_data_helper
import onnx.helper

from onnx2jax.errors import ModelLoadError

# Bits per element of the types stored packed (several values per byte).
_PACKED_BITS = {
    onnx.TensorProto.INT4: 4,
    onnx.TensorProto.UINT4: 4,
    onnx.TensorProto.FLOAT4E2M1: 4,
    onnx.TensorProto.INT2: 2,
    onnx.TensorProto.UINT2: 2,
    onnx.TensorProto.FLOAT6E2M3: 6,
    onnx.TensorProto.FLOAT6E3M2: 6,
}
_COMPLEX = (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128)


def check_model(proto: onnx.ModelProto, where: str) -> None:
    """Refuses a model this runtime cannot read safely.

    Args:
      proto: the model, its external data not yet loaded.
      where: the file (or ``<bytes>``, ``<ModelProto>``) for messages.

    Raises:
      ModelLoadError: naming the field, tensor or node at fault.
    """
    _check_versions(proto, where)
    for tensor, owner in _embedded_tensors(proto):
        _check_tensor(tensor, owner, where)
    for graph, owner in _graphs(proto):
        _check_single_producer(graph, owner, where)


def _known_opsets() -> dict[str, int]:
    _, _, default, ml, training = onnx.helper.VERSION_TABLE[-1]
    return {
        "": max(default, onnx.defs.onnx_opset_version()),
        "ai.onnx": max(default, onnx.defs.onnx_opset_version()),
        "ai.onnx.ml": ml,
        "ai.onnx.training": training,
        "ai.onnx.preview.training": training,
    }


def _check_versions(proto: onnx.ModelProto, where: str) -> None:
    if proto.ir_version > onnx.IR_VERSION or proto.ir_version < 0:
        raise ModelLoadError(
            f"{where}: ir_version {proto.ir_version} is not one this onnx ({onnx.__version__}) "
            f"knows (at most {onnx.IR_VERSION})"
        )
    known = _known_opsets()
    for opset in proto.opset_import:
        limit = known.get(opset.domain)
        if limit is not None and not 1 <= opset.version <= limit:
            domain = opset.domain or "ai.onnx"
            raise ModelLoadError(
                f"{where}: opset {opset.version} of domain {domain!r} is not one this onnx "
                f"({onnx.__version__}) knows (1 to {limit}); its ops' meaning is unknown"
            )


def _graphs(proto: onnx.ModelProto) -> Iterator[tuple[onnx.GraphProto, str]]:
    """Every graph of the model (main graph, then subgraphs, then functions' subgraphs), with where it sits."""
    yield proto.graph, "the main graph"
    yield from _subgraphs(proto.graph.node)
    for function in proto.functions:
        yield from _subgraphs(function.node)


def _subgraphs(nodes) -> Iterator[tuple[onnx.GraphProto, str]]:
    for node in nodes:
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield sub, f"subgraph {attr.name!r} of node {_node_name(node)}"
                yield from _subgraphs(sub.node)


def _node_name(node: onnx.NodeProto) -> str:
    return f"{node.name!r} ({node.op_type})" if node.name else f"({node.op_type}, unnamed)"


def _attribute_tensors(nodes, owner: str) -> Iterator[tuple[onnx.TensorProto, str]]:
    for node in nodes:
        for attr in node.attribute:
            where = f"attribute {attr.name!r} of node {_node_name(node)}"
            if attr.HasField("t"):
                yield attr.t, where
            for tensor in attr.tensors:
                yield tensor, where
            for sparse in (*([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []), *attr.sparse_tensors):
                yield sparse.values, where
                yield sparse.indices, where


def _embedded_tensors(proto: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    for graph, owner in _graphs(proto):
        for tensor in graph.initializer:
            yield tensor, f"an initializer of {owner}"
        for sparse in graph.sparse_initializer:
            yield sparse.values, f"a sparse initializer of {owner}"
            yield sparse.indices, f"a sparse initializer of {owner}"
        yield from _attribute_tensors(graph.node, owner)
    for function in proto.functions:
        yield from _attribute_tensors(function.node, f"function {function.name!r}")


def _check_tensor(tensor: onnx.TensorProto, owner: str, where: str) -> None:
    name = f"{where}: tensor {tensor.name!r} ({owner})"
    if onnx.external_data_helper.uses_external_data(tensor):
        return  # checked against its file by loading._check_external
    if tensor.HasField("segment"):
        raise ModelLoadError(f"{name} is stored in segments, which onnx2jax does not read")
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except (KeyError, TypeError, ValueError):
        raise ModelLoadError(f"{name} has data_type {tensor.data_type}, which ONNX does not define") from None
    if any(d < 0 for d in tensor.dims):
        raise ModelLoadError(f"{name} has negative dims {list(tensor.dims)}")
    count = math.prod(tensor.dims)
    bits = _PACKED_BITS.get(tensor.data_type)
    if tensor.HasField("raw_data") and tensor.data_type != onnx.TensorProto.STRING:
        expected = -(-count * bits // 8) if bits else count * itemsize
        found = len(tensor.raw_data)
        unit = "bytes"
        ok = found == expected
    else:
        found = len(getattr(tensor, field))
        unit = f"values in {field}"
        if bits:  # packed types: one value per entry, or packed into bytes or 32-bit words
            allowed = {count, -(-count * bits // 8), -(-count * bits // 32)}
        else:
            allowed = {2 * count if tensor.data_type in _COMPLEX else count}
        expected = min(allowed)
        ok = found in allowed
    if not ok:
        raise ModelLoadError(
            f"{name} has dims {list(tensor.dims)} ({count:,} elements of "
            f"{onnx.TensorProto.DataType.Name(tensor.data_type)}) but holds {found:,} {unit} "
            f"(expected {expected:,})"
        )


def _check_single_producer(graph: onnx.GraphProto, owner: str, where: str) -> None:
    sources = {i.name: "a graph input" for i in graph.input}
    sources.update({t.name: "an initializer" for t in graph.initializer})
    sources.update({t.values.name: "a sparse initializer" for t in graph.sparse_initializer})
    producer: dict[str, str] = {}
    for node in graph.node:
        for name in node.output:
            if not name:
                continue
            if name in producer:
                first = producer[name]
            elif name in sources:
                first = sources[name]
            else:
                producer[name] = f"node {_node_name(node)}"
                continue
            raise ModelLoadError(
                f"{where}: tensor {name!r} in {owner} is written by {first} and by node "
                f"{_node_name(node)}; each tensor of an ONNX graph has one producer (SSA)"
            )
