"""Issue 24, item 5: ``onnx2jax conformance --op X`` generates only X's node cases, the same ones as the full set.

Reference: ONNX's own full generation (``collect_testcases``), filtered by the op each case tests. A fresh
interpreter, so that the targeted generation runs before anything has generated every case.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import sys
from onnx2jax.conformance import node_cases, op_cases, tested_ops
ops = ["Gather", "Softmax", "LayerNormalization", "ReduceSum", "Scan", "LabelEncoder"]
targeted = {op: [c.name for c in op_cases(op)] for op in ops}
generated = [m for m, module in sys.modules.items()
             if m.startswith("onnx.backend.test.case.node.") and not hasattr(module, "__path__")]  # packages hold no case
assert not generated, f"generator modules left imported: {generated}"
everything = node_cases()
tested = tested_ops(everything)
for op in ops:
    full = [c.name for c in everything if tested.get(c.name) == op]
    assert full and targeted[op] == full, (op, targeted[op], full)
assert len(everything) > 1500
assert [c.name for c in op_cases("Gather")] == targeted["Gather"]  # from the full set now
assert op_cases("Gathr") == ()
"""


def test_op_cases_are_the_full_sets_cases_of_that_op():
    subprocess.run([sys.executable, "-c", CODE], check=True, cwd=ROOT, timeout=600)
