"""Issue 24, item 5: ``onnx2jax conformance --op X`` generates only X's node cases, the same ones as the full set.

Reference: ONNX's own full generation (``collect_testcases``), filtered by the op each case tests. The targeted
generation runs in a fresh interpreter, before anything there has generated every case; the full set is this
process's (generated once per process, as the node cases' test module already did at collection).
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import json, sys
from onnx2jax.conformance import op_cases
ops = sys.argv[1:]
targeted = {op: [c.name for c in op_cases(op)] for op in ops}
generated = [m for m, module in sys.modules.items()
             if m.startswith("onnx.backend.test.case.node.") and not hasattr(module, "__path__")]  # packages hold no case
assert not generated, f"generator modules left imported: {generated}"
print(json.dumps(targeted))
"""
OPS = ["Gather", "Softmax", "LayerNormalization", "ReduceSum", "Scan", "LabelEncoder"]


def test_op_cases_are_the_full_sets_cases_of_that_op():
    from onnx2jax.conformance import node_cases, op_cases, tested_ops

    done = subprocess.run([sys.executable, "-c", CODE, *OPS], cwd=ROOT, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    targeted = json.loads(done.stdout.strip().splitlines()[-1])
    everything = node_cases()
    tested = tested_ops(everything)
    assert len(everything) > 1500
    for op in OPS:
        full = [c.name for c in everything if tested.get(c.name) == op]
        assert full and targeted[op] == full, (op, targeted[op], full)
    assert [c.name for c in op_cases("Gather")] == targeted["Gather"]  # from the full set now
    assert op_cases("Gathr") == ()
