"""One process of a two-process sharded run of a segmented model (test_segments_sharded.py starts two).

The torch-exported detection head, its conv pair split over the 8 devices of
both processes (4 fake CPU devices each); NonMaxSuppression runs on the host
of every process after the gather. Then NonZero of a tensor split over both
processes' devices (its gather crosses processes). Process 0 saves the
outputs, gathered.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, 2, args.process_id)

    import numpy as np
    from jax.experimental import multihost_utils

    import onnx2jax

    sys.path.insert(0, str(HERE))
    from test_segments_sharded import DETECTION, nonzero_of_a_split_tensor, torch_head_channel_parallel

    compiled = onnx2jax.compile(torch_head_channel_parallel())
    inputs = dict(np.load(DETECTION / "head.some.inputs.npz"))
    outputs = compiled(**inputs)
    gathered = [np.asarray(multihost_utils.process_allgather(o, tiled=True)) for o in outputs]
    kinds = [s.kind for s in compiled.segments]
    print(f"process {args.process_id}: {kinds} over {jax.device_count()} devices, {len(gathered[0])} boxes kept")
    # NonZero of a tensor split over both processes' devices: the gather crosses processes.
    x = np.random.default_rng(13).normal(size=(4, 16)).astype(np.float32)
    (where,) = onnx2jax.compile(nonzero_of_a_split_tensor())(x)
    where = np.asarray(multihost_utils.process_allgather(where, tiled=True))
    print(f"process {args.process_id}: NonZero of a split tensor kept {where.shape[1]} elements")
    if args.output and args.process_id == 0:
        np.savez(args.output, where=where, **dict(zip(compiled.output_names, gathered)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
