"""ONNX's own node test cases, run through onnx2jax.

The onnx wheel carries the generators of its backend node tests
(``onnx.backend.test.case.node.collect_testcases``): about 1,900 single-node
models with inputs and expected outputs. This module runs them and compares
like ONNX's backend runner does (same dtype, ``assert_allclose`` with the
case's rtol/atol), so that the pass rate is a number anyone can reproduce:
``onnx2jax conformance``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pathlib
import re
import sys
import warnings
from typing import Any, Callable, Iterable

import jax
import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
import yaml
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

from onnx2jax.translate import translate
from sharding import op_facts


@functools.lru_cache(maxsize=1)
def node_cases() -> tuple[TestCase, ...]:
    """ONNX's node test cases, sorted by name (generated once per process)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases() if c.kind == "node"]
    return tuple(sorted(cases, key=lambda c: c.name))


def op_cases(op_type: str) -> tuple[TestCase, ...]:
    """The node cases that test ``op_type`` (its ``*_expanded`` cases included), generating only those.

    ONNX generates every case when its test package is imported (each case's
    expected outputs are computed then), which takes seconds; this imports
    only the generator modules whose source names ``op_type``, with ONNX's own
    op filter on, and leaves ONNX's registries as they were, so that a later
    :func:`node_cases` still generates everything. When every case is already
    generated, it filters those instead.
    """
    if node_cases.cache_info().currsize:
        return _testing(node_cases(), op_type)
    import onnx.backend.test.case.node as package

    modules = _generator_modules(pathlib.Path(package.__file__).parent, package.__name__, op_type)
    cases, names = package._NodeTestCases, package._existing_names
    count, known, target = len(cases), set(names), package._TargetOpType
    package._TargetOpType = op_type
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for module in modules:
                if module not in sys.modules:
                    importlib.import_module(module)
        found = list(cases[count:])
    finally:
        package._TargetOpType = target
        del cases[count:]
        for name in set(names) - known:
            del names[name]
        for module in modules:
            sys.modules.pop(module, None)
    found = _testing(sorted(found, key=lambda c: c.name), op_type)
    return found or _testing(node_cases(), op_type)  # an op no module names: the full generation decides


def _testing(cases: Iterable[TestCase], op_type: str) -> tuple[TestCase, ...]:
    cases = [c for c in cases if c.kind == "node"]
    tested = tested_ops(cases)
    return tuple(c for c in cases if tested.get(c.name) == op_type)


def _generator_modules(folder: pathlib.Path, package: str, op_type: str) -> list[str]:
    """The modules under ONNX's node-case package whose source has ``op_type`` as a string literal or a class.

    (A case written in ONNX's text format names its op in a graph string; its module's class has the op's name.)
    """
    literal = re.compile(rf"""["']{re.escape(op_type)}["']|class {re.escape(op_type)}\(""")
    modules = []
    for path in sorted(folder.rglob("*.py")):
        if path.name == "__init__.py" or not literal.search(path.read_text(encoding="utf-8")):
            continue
        relative = path.relative_to(folder).with_suffix("")
        modules.append(".".join([package, *relative.parts]))
    return modules


def case_op_types(case: TestCase) -> tuple[str, ...]:
    """The op types a case's model uses (normally one)."""
    return tuple(sorted({n.op_type for n in case.model.graph.node}))


def tested_ops(cases: Iterable[TestCase]) -> dict[str, str]:
    """The op each case tests (case name -> op type), for cases where one op is under test.

    A single-node case tests its node's op; an ``*_expanded`` case (the op's
    function body) tests the op of the single-node case it expands, even when
    that body is one node of another op (Clip's default bounds expand to an
    Identity). Other multi-node cases test no single op and are left out.
    """
    cases = list(cases)
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    tested = {}
    for case in cases:
        base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
        op = single.get(base) if base != case.name else single.get(case.name)
        if op is not None:
            tested[case.name] = op
    return tested


BFLOAT16_RTOL = 2.0**-6
"""The least rtol for a bfloat16 output: two bfloat16 ulps, as ONNX's backend runner compares them.

``onnx.backend.test.runner.Runner.assert_similar_outputs`` (onnx 1.23) raises
a case's rtol to this for bfloat16, whose 8-bit significand cannot meet the
1e-3 that most cases ask for: a sum rounded in another order is one ulp away.
"""


def assert_outputs_match(
    expected: Any, actual: Any, rtol: float, atol: float, where: str = "", defined: np.ndarray | None = None
) -> None:
    """Asserts one output equals ONNX's expected value: same dtype, values within tolerance.

    Sequences (lists) are compared element by element; strings and bools exactly;
    bfloat16 within at least :data:`BFLOAT16_RTOL`, like ONNX's backend runner.
    ``defined`` (a boolean mask of the output's shape) limits the comparison to
    the elements ONNX defines (:func:`defined_elements`); dtype and shape are
    always compared.
    """
    if isinstance(expected, list):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_outputs_match(e, a, rtol, atol, f"{where}[{i}]")
        return
    if expected is None:
        if actual is not None:
            raise AssertionError(f"{where}: expected an empty optional, got a value")
        return
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if expected.dtype != actual.dtype:
        raise AssertionError(f"{where}: dtype {actual.dtype}, expected {expected.dtype}")
    if expected.shape != actual.shape:
        raise AssertionError(f"{where}: shape {actual.shape}, expected {expected.shape}")
    if defined is not None:
        expected, actual = expected[defined], actual[defined]
    if expected.dtype.kind in "OUSb" or expected.dtype.kind in "iu":
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    else:
        if expected.dtype.name == "bfloat16":
            rtol = max(rtol, BFLOAT16_RTOL)
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, err_msg=where
        )


def _as_numpy(value: Any) -> Any:
    """Case data as numpy: some cases store float8/4-bit values as TensorProtos."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_as_numpy(v) for v in value]
    return value


CASTS = frozenset({"Cast", "CastLike"})


def defined_elements(graph: onnx.GraphProto, feeds: dict[str, Any], output: str) -> np.ndarray | None:
    """Which elements of a graph output ONNX defines, as a mask; None when all are.

    ONNX's Cast says a cast from a floating-point type to an integer type is
    undefined where the value is out of the integer type's range ("fixed point:
    undefined if OOR"), and NaN and infinities with it. ONNX's expected outputs
    for such elements are whatever its reference's numpy and ml_dtypes happened
    to give (ml_dtypes 0.7 turned -9.0 -> int4 from 7 into 0), so a case cannot
    judge them. This finds an output made by a Cast or CastLike straight from a
    graph input of floats to an integer type (the single-node cases and their
    ``_expanded`` bodies) and masks out the undefined elements; onnx2jax's own
    choice for them (4- and 2-bit integers wrap; see onnx2jax.ops.cast) is
    tested in its op tests.
    """
    node = next((n for n in graph.node if n.op_type in CASTS and output in n.output), None)
    if node is None or node.input[0] not in feeds:
        return None
    x = np.asarray(feeds[node.input[0]])
    to = _cast_target(graph, node, feeds)
    if to is None or not _is_float(x.dtype):
        return None
    try:
        info = ml_dtypes.iinfo(to)  # numpy's integers and ml_dtypes' int4/uint4/int2/uint2 (numpy kind "V")
    except ValueError:
        return None
    with np.errstate(invalid="ignore"):
        value = np.trunc(x.astype(np.float64))
        mask = np.isfinite(value) & (value >= info.min) & (value <= info.max)
    return None if mask.all() else mask


def _is_float(dtype: np.dtype) -> bool:
    """numpy's floats and ml_dtypes' (bfloat16, float8, float4: numpy kind "V")."""
    try:
        ml_dtypes.finfo(dtype)
    except ValueError:
        return False
    return True


def _cast_target(graph: onnx.GraphProto, node: onnx.NodeProto, feeds: dict[str, Any]) -> np.dtype | None:
    """The dtype a Cast (its ``to``) or a CastLike (its second input's dtype) converts to."""
    if node.op_type == "CastLike":
        target = feeds.get(node.input[1])
        return None if target is None else np.asarray(target).dtype
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    return None if to is None else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))


def run_case(case: TestCase) -> None:
    """Runs one node case through onnx2jax (jitted); raises on any difference in what ONNX defines."""
    model = translate(case.model)
    graph = case.model.graph
    for index, (inputs, outputs) in enumerate(case.data_sets):
        inputs, outputs = _as_numpy(list(inputs)), _as_numpy(list(outputs))
        feeds = dict(zip([i.name for i in graph.input], inputs))
        actual = model(*inputs)
        for name, e, a in zip(model.output_names, outputs, actual):
            assert_outputs_match(
                e, a, case.rtol, case.atol, f"{case.name} set {index} output {name!r}",
                defined=defined_elements(graph, feeds, name),
            )


RANDOM_OPS = op_facts.RANDOM
"""Ops whose outputs are random draws (Dropout is not one: its draw is ONNX's seeded reference draw)."""

RANDOM_REASON = "random: cannot match the reference's generator"
"""Why a random case fails: its expected values are one draw of numpy's global generator."""


@dataclasses.dataclass
class CaseResult:
    name: str
    op_types: tuple[str, ...]
    passed: bool
    error: str = ""

    @property
    def random(self) -> bool:
        """Whether the case draws random numbers (uses one of :data:`RANDOM_OPS`)."""
        return bool(RANDOM_OPS.intersection(self.op_types))


def pass_rates(results: Iterable[CaseResult]) -> list[str]:
    """The pass rate, over all cases and over the cases without random ops, as report lines.

    Random cases are their own category (:data:`RANDOM_REASON`): their expected
    values are one draw of numpy's unseeded generator, which no other generator
    reproduces, so the second rate leaves them out of both counts.
    """
    results = list(results)
    lines = [_rate(results, "node cases pass")]
    random = [r for r in results if r.random]
    if random:
        failed = sum(not r.passed for r in random)
        lines.append(_rate([r for r in results if not r.random], "pass")
                     + f" without the {len(random)} random cases ({failed} failing; {RANDOM_REASON})")
    return lines


def _rate(results: list[CaseResult], verb: str) -> str:
    passed = sum(r.passed for r in results)
    return f"{passed}/{len(results)} {verb} ({100 * passed / max(len(results), 1):.1f}%)"


def expected_failures() -> dict[str, str]:
    """The cases onnx2jax is known not to pass, with their reasons (case name -> reason).

    Read from ``node_xfails.yaml``, the list the test suite holds strictly
    (tests/onnx2jax/node_xfails.yaml; the package carries it as data).
    """
    path = pathlib.Path(__file__).resolve().parent / "data" / "node_xfails.yaml"
    grouped = yaml.safe_load(path.read_text()) or {}
    return {case: reason for by_case in grouped.values() for case, reason in by_case.items()}


def run_cases(cases: Iterable[TestCase], on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Runs every case, catching failures, for the CLI's pass-rate report; ``on_result`` sees each result."""
    results = []
    for case in cases:
        try:
            run_case(case)
            results.append(CaseResult(case.name, case_op_types(case), True))
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            results.append(CaseResult(case.name, case_op_types(case), False, f"{type(e).__name__}: {e}"[:300]))
        if on_result is not None:
            on_result(results[-1])
        if len(results) % 200 == 0:
            jax.clear_caches()  # thousands of tiny programs otherwise pile up in memory
    return results
