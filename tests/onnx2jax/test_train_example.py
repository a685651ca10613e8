"""examples/finetune.py runs: a zoo LM fine-tuned under TP 8, its loss falling, written back and run in onnxruntime.

The example itself checks onnxruntime's logits on the written model against
the trained JAX program (its exit status says so); here it runs with few steps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the example end to end (a subprocess, TP 8); its steps: test_train_steps, test_train_surface
def test_finetune_example_loss_falls_and_onnxruntime_runs_the_result(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "finetune.py"), "--steps", "40", "--out", str(tmp_path / "ft.onnx")],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", done.stdout).groups())
    assert last < 0.8 * first
    assert (tmp_path / "ft.onnx").exists() and "onnxruntime: max |logits - jax|" in done.stdout
