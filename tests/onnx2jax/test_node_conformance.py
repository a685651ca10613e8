"""ONNX's node test cases (from the onnx wheel's generators) through onnx2jax.

Every case must pass, or be listed with a reason in node_xfails.yaml, grouped
by op type. The xfails are strict: a listed case that starts passing fails the
run, so the file stays true.

The ``_expanded`` cases (an op run through its ONNX function body, whose ops each
have their own cases) run with ``-m slow``: a quarter of the cases, a minute of
the default suite.
"""

import pathlib

import pytest
import yaml

from onnx2jax.conformance import RANDOM_OPS, RANDOM_REASON, CaseResult, case_op_types, node_cases, pass_rates, run_case

XFAILS_FILE = pathlib.Path(__file__).with_name("node_xfails.yaml")


def _xfails() -> dict[str, str]:
    grouped = yaml.safe_load(XFAILS_FILE.read_text()) or {}
    return {case: reason for cases in grouped.values() for case, reason in cases.items()}


def _params():
    xfails = _xfails()
    unknown = set(xfails) - {c.name for c in node_cases()}
    assert not unknown, f"node_xfails.yaml names cases that do not exist: {sorted(unknown)}"
    for case in node_cases():
        marks = [pytest.mark.slow] if "_expanded" in case.name else []
        if case.name in xfails:
            marks.append(pytest.mark.xfail(reason=xfails[case.name], strict=True))
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_node_case(case):
    run_case(case)


def test_xfails_are_grouped_by_the_cases_op_type():
    grouped = yaml.safe_load(XFAILS_FILE.read_text()) or {}
    cases = {c.name: c for c in node_cases()}
    misplaced = [
        (op, name) for op, entries in grouped.items() for name in entries
        if name in cases and op not in case_op_types(cases[name])
    ]
    assert not misplaced, f"cases listed under an op type they do not use: {misplaced}"


def test_only_random_cases_are_expected_to_fail():
    # The one named exception: cases whose expected values are a draw of numpy's generator.
    cases = {c.name: c for c in node_cases()}
    not_random = [name for name in _xfails() if not RANDOM_OPS.intersection(case_op_types(cases[name]))]
    assert not not_random, f"node_xfails.yaml lists cases that use no random op: {not_random}"
    unlabelled = [name for name, reason in _xfails().items() if not reason.startswith(RANDOM_REASON)]
    assert not unlabelled, f"reasons that do not start with {RANDOM_REASON!r}: {unlabelled}"


def test_pass_rates_with_and_without_random_cases():
    results = [
        CaseResult("a", ("Relu",), True),
        CaseResult("b", ("Add",), False),
        CaseResult("c", ("Bernoulli",), False),
        CaseResult("d", ("Cast", "RandomUniformLike"), True),
    ]
    assert pass_rates(results) == [
        "2/4 node cases pass (50.0%)",
        f"1/2 pass (50.0%) without the 2 random cases (1 failing; {RANDOM_REASON})",
    ]
    assert pass_rates(results[:2]) == ["1/2 node cases pass (50.0%)"]


def test_only_out_of_range_float_to_integer_casts_are_left_uncompared():
    # ONNX's Cast: float -> integer is undefined out of the integer type's range (NaN and infinities too).
    import numpy as np
    import onnx
    import onnx.helper as oh

    from onnx2jax.conformance import defined_elements

    def graph(to):
        node = oh.make_node("Cast", ["x"], ["y"], to=to)
        return oh.make_graph([node], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [6])],
                             [oh.make_tensor_value_info("y", to, [6])])

    x = np.array([-9.0, -8.9, 7.9, 8.0, np.nan, 3.0], np.float32)
    mask = defined_elements(graph(onnx.TensorProto.INT4), {"x": x}, "y")
    np.testing.assert_array_equal(mask, [False, True, True, False, False, True])
    assert defined_elements(graph(onnx.TensorProto.INT32), {"x": x}, "y") is not None  # NaN is undefined there too
    assert defined_elements(graph(onnx.TensorProto.INT32), {"x": x[:4]}, "y") is None
    assert defined_elements(graph(onnx.TensorProto.FLOAT16), {"x": x}, "y") is None  # float -> float is defined
    assert defined_elements(graph(onnx.TensorProto.INT4), {"x": x.astype(np.int32)}, "y") is None  # int -> int4
