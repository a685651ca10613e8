"""Tensor parallelism across processes: 2 processes x 4 CPU devices equal the single-process run on 8.

Runs examples/multihost.py twice (jax.distributed on 127.0.0.1, gloo
collectives between the processes) and compares the logits process 0
gathers with the same Megatron plan compiled in this process on its 8 fake
devices, and with the unsharded run.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx2jax
from sharding.megatron import megatron_plan

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "data" / "tiny_llama.onnx"
TIMEOUT = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_process_of_eight(tmp_path):
    out = tmp_path / "logits.npy"
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    processes = []
    try:
        for rank in range(2):
            argv = [sys.executable, str(ROOT / "examples" / "multihost.py"), "--coordinator", coordinator,
                    "--num-processes", "2", "--process-id", str(rank), "--cpu-devices", "4"]
            if rank == 0:
                argv += ["--output", str(out)]
            processes.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=TIMEOUT)[0] for p in processes]
    finally:
        for p in processes:  # always: a process left waiting for its peer would hang around
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(processes, logs, strict=True)):
        assert p.returncode == 0, f"process {rank}:\n{log[-3000:]}"
        assert f"process {rank}: logits (2, 16, 256) over 8 devices" in log

    input_ids = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int64)  # as the script draws them
    model = onnx.load(LLAMA)
    (single,) = onnx2jax.compile(megatron_plan(model, 8))(input_ids)
    (unsharded,) = onnx2jax.translate(model)(input_ids)
    multi = np.load(out)
    np.testing.assert_allclose(multi, np.asarray(single), atol=1e-5)
    np.testing.assert_allclose(multi, np.asarray(unsharded), atol=1e-4)
