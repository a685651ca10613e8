"""`sharding` is framework-neutral: importing it must not import jax."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_sharding_does_not_import_jax():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    code = "import sys; import sharding; assert 'jax' not in sys.modules, 'jax was imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_what_explain_plot_draws_is_computed_without_jax_or_matplotlib():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    code = (
        "import sys; import sharding.tile_map; "
        "assert 'jax' not in sys.modules and 'matplotlib' not in sys.modules, 'jax or matplotlib was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
