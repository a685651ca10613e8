"""Tensor parallelism over several processes (hosts): the same program, one process per host.

Every process runs this script; `jax.distributed.initialize` joins them, and
`jax.devices()` then lists the devices of every process (the *global*
devices, in process order). The annotated model is compiled exactly as on one
host: configuration device i is `jax.devices()[i]`, so a Megatron plan for
`jax.device_count()` devices spans all hosts and XLA's collectives cross
them. Each process feeds the same token ids; the logits are gathered to every
process at the end (`process_allgather`) and compared with the unsharded run.

Two processes on this machine, 4 fake CPU devices each (8 in all):

    python examples/multihost.py --num-processes 2 --process-id 0 --cpu-devices 4 &
    python examples/multihost.py --num-processes 2 --process-id 1 --cpu-devices 4

On a cluster, run it once per host with the first host's address, e.g. on
host k of 2 GPU machines (every local GPU is used):

    python examples/multihost.py --coordinator HOST0:12355 --num-processes 2 --process-id k

On a TPU pod slice, `jax.distributed.initialize()` finds the coordinator
itself: run the same command on every worker with no flags at all
(`gcloud compute tpus tpu-vm ssh NAME --worker=all --command "python examples/multihost.py"`).
Needs only onnx2jax (no torch).
"""

from __future__ import annotations

import argparse
import pathlib

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama.onnx"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=None, help="HOST:PORT of process 0 (default: 127.0.0.1:12355 "
                        "with --num-processes; found by jax on TPU pods and SLURM)")
    parser.add_argument("--num-processes", type=int, default=None, help="how many processes take part")
    parser.add_argument("--process-id", type=int, default=None, help="this process's index, 0 .. N-1")
    parser.add_argument("--cpu-devices", type=int, default=0, help="run on N fake CPU devices per process")
    parser.add_argument("--model", default=str(FIXTURE), help="an ONNX transformer (default: the tiny Llama)")
    parser.add_argument("--output", default=None, help="process 0 saves the gathered logits here (.npy)")
    args = parser.parse_args()

    import jax

    if args.cpu_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
    if args.num_processes is None:
        jax.distributed.initialize()  # TPU pods, SLURM, ...: everything from the environment
    else:
        jax.distributed.initialize(args.coordinator or "127.0.0.1:12355", args.num_processes, args.process_id)

    import numpy as np
    import onnx
    from jax.experimental import multihost_utils

    import onnx2jax
    from sharding.megatron import megatron_plan

    devices = jax.device_count()
    print(f"process {jax.process_index()}/{jax.process_count()}: {jax.local_device_count()} local devices "
          f"of {devices}", flush=True)
    model = onnx.load(args.model)
    compiled = onnx2jax.compile(megatron_plan(model, devices))
    input_ids = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int64)  # the same in every process
    (logits,) = compiled(input_ids)
    gathered = np.asarray(multihost_utils.process_allgather(logits, tiled=True))
    (reference,) = onnx2jax.translate(model)(input_ids)  # each process also runs it unsharded, locally
    diff = float(np.max(np.abs(gathered - np.asarray(reference))))
    print(f"process {jax.process_index()}: logits {gathered.shape} over {devices} devices, "
          f"max |sharded - unsharded| = {diff:.3g}", flush=True)
    if args.output and jax.process_index() == 0:
        np.save(args.output, gathered)
    jax.distributed.shutdown()
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
