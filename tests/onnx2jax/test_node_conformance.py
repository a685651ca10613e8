"""ONNX's node test cases (from the onnx wheel's generators) through onnx2jax.

Every case must pass, or be listed with a reason in node_xfails.yaml, grouped
by op type. The xfails are strict: a listed case that starts passing fails the
run, so the file stays true.
"""

import pathlib

import pytest
import yaml

from onnx2jax.conformance import case_op_types, node_cases, run_case

XFAILS_FILE = pathlib.Path(__file__).with_name("node_xfails.yaml")


def _xfails() -> dict[str, str]:
    grouped = yaml.safe_load(XFAILS_FILE.read_text()) or {}
    return {case: reason for cases in grouped.values() for case, reason in cases.items()}


def _params():
    xfails = _xfails()
    unknown = set(xfails) - {c.name for c in node_cases()}
    assert not unknown, f"node_xfails.yaml names cases that do not exist: {sorted(unknown)}"
    for case in node_cases():
        marks = []
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
