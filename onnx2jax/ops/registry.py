"""The op registry: (domain, op_type, since_version) -> a jax implementation.

An implementation is a plain function. Inputs arrive positionally (``None`` for
an omitted optional input), attributes as keyword arguments named exactly as in
the ONNX spec, with the schema's defaults already filled in by the translator.
It returns one array or a tuple of arrays.

Versions are registered *exactly*: ``@register("Relu", 6, 13, 14)`` claims the
schema versions 6, 13 and 14. A model whose opset resolves to a schema version
nobody registered fails loudly instead of running code written for another
version of the op.

Each implementation also carries its op's facts (elementwise, shape-reading, data-dependent output
shapes, 64-bit results, random draws): ``register`` reads them from :mod:`sharding.op_facts`, the
jax-free table that partitioning and planning read too, so both sides ask one source. Attribute
defaults are the schema's (``onnx.defs``), filled in by ``graph_runner.node_attributes``: an
implementation repeats no schema default; only ops without an ONNX schema (contrib domains) keep
Python defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, NamedTuple

import onnx.defs

from sharding.op_facts import OpFacts, facts_of


class OpKey(NamedTuple):
    """One registered schema version of one op."""

    domain: str
    op_type: str
    since_version: int


@dataclasses.dataclass(frozen=True)
class OpImpl:
    """A registered implementation and what the translator must give it.

    Attributes:
      fn: the implementation.
      static_inputs: positions of inputs that must be known while tracing (a
        Reshape's shape, a Slice's starts); the translator passes them as numpy
        arrays and refuses to trace otherwise.
      needs_context: whether ``fn`` takes an :class:`OpContext` as its first
        argument (subgraphs, node names, opset).
      host_values: whether ``fn`` passes on values that the host finishes
        after the run (:mod:`onnx2jax.hostvalues`: run-time strings, maps);
        every other op is refused such an input by name.
      facts: the op's facts (:mod:`sharding.op_facts`).
    """

    fn: Callable
    static_inputs: frozenset[int] = frozenset()
    needs_context: bool = False
    host_values: bool = False
    facts: OpFacts = OpFacts()


_REGISTRY: dict[OpKey, OpImpl] = {}


def register(
    op_type: str,
    *since_versions: int,
    domain: str = "",
    static_inputs: Iterable[int] = (),
    context: bool = False,
    host_values: bool = False,
) -> Callable[[Callable], Callable]:
    """Registers ``fn`` for the given schema versions of ``op_type``.

    Raises:
      ValueError: a version is registered twice, or none is given.
    """
    if not since_versions:
        raise ValueError(f"register({op_type!r}) needs at least one since_version")

    def decorate(fn: Callable) -> Callable:
        impl = OpImpl(fn, frozenset(static_inputs), context, host_values, facts_of(op_type, domain))
        for version in since_versions:
            key = OpKey(domain, op_type, version)
            if key in _REGISTRY:
                raise ValueError(f"{key} is registered twice")
            _REGISTRY[key] = impl
        return fn

    return decorate


def schema_version(domain: str, op_type: str, opset: int) -> int | None:
    """The since_version of the schema that ``opset`` selects, or None if ONNX has none."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def lookup(domain: str, op_type: str, opset: int) -> OpImpl | None:
    """The implementation for ``op_type`` at ``opset`` in ``domain``, or None.

    An op that ONNX's own schemas do not define (onnxruntime's contrib ops: ``com.microsoft``'s
    GroupQueryAttention, or ``SimplifiedLayerNormalization`` written in the default domain) resolves to
    the newest version registered at or below ``opset``, as onnxruntime resolves its own kernels.
    """
    version = schema_version(domain, op_type, opset)
    if version is None:
        known = [key.since_version for key in _REGISTRY if key.domain == domain and key.op_type == op_type]
        version = max((v for v in known if v <= opset), default=None)
        if version is None:
            return None
    return _REGISTRY.get(OpKey(domain, op_type, version))


def registered() -> frozenset[OpKey]:
    """Every registered (domain, op_type, since_version)."""
    return frozenset(_REGISTRY)


def ops_with(predicate: Callable[[OpFacts], bool], domain: str | None = None) -> frozenset[str]:
    """The registered op types whose facts satisfy ``predicate`` (``lambda f: f.elementwise``, say),
    of ``domain`` only where given."""
    return frozenset(
        key.op_type
        for key, impl in _REGISTRY.items()
        if (domain is None or key.domain == domain) and predicate(impl.facts)
    )
