"""A non-editable install runs the demo: the wheel carries the demo model (package data).

Offline, nothing fetched from any package index: builds the wheel with pip
and this environment's setuptools (``--no-build-isolation --no-index``; the
``test`` extra has setuptools), installs it with ``--no-deps --no-index`` into
a temporary venv that also sees this environment's site-packages (jax,
onnx... come from there), and runs ``onnx2jax demo`` from an empty folder
outside the checkout, so that neither the checkout's code nor its
``tests/data`` can be used.

The venv is not made with ``--system-site-packages``: made from a venv's
interpreter, that would expose the base interpreter's site-packages, not this
environment's; a ``.pth`` file in the new venv appends this environment's
instead.
"""

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_runs_the_demo(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("onnx2jax-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # This environment's site-packages go after the new venv's own (a .pth line appends to sys.path,
    # and .pth files inside it, such as an editable onnx2jax's, are not run): the wheel's onnx2jax wins.
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "outer_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["JAX_PLATFORMS"] = "cpu"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the demo's compilation cache stays in tmp_path
    where = subprocess.run(
        [str(python), "-c", "import onnx2jax; print(onnx2jax.__file__)"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=120,
    )
    assert where.stdout.startswith(str(env_dir)), (where.stdout, where.stderr)
    shipped = subprocess.run(  # the files the README's examples reach through onnx2jax.data_path
        [str(python), "-c", "import onnx2jax.bundled as b; assert all((b.DATA / n).exists() for n in b.FILES)"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=120,
    )
    assert shipped.returncode == 0, shipped.stderr
    demo = subprocess.run(
        [str(env_dir / "bin" / "onnx2jax"), "demo"], cwd=empty, env=env, capture_output=True, text=True, timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    # The demo's collectives (the Megatron plan on the tiny Llama: 2 layers x 2 row-parallel
    # projections + the vocabulary-split embedding) and its verdict against the unsharded run.
    assert "collectives per call: all-reduce 5;" in demo.stdout, demo.stdout[-2000:]  # and no other kind
    assert "OK" in demo.stdout
