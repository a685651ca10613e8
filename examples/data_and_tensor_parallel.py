"""Data x tensor parallel on a 2x4 mesh: batch on one axis, the model on the other.

The Megatron plan is made for the 4 devices of the model axis; each of its
specs is then lifted to 8 devices by replicating every shard over the data
axis (shard k of a 4-way split lives on devices k and 4 + k), and the token
ids are split by batch over the data axis. onnx2jax maps configuration
device i onto position i of the mesh, row-major, so device 4 * d + m sits at
data index d, model index m.

    python examples/data_and_tensor_parallel.py
"""

from __future__ import annotations

import pathlib

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime.spmd import count_collectives  # noqa: E402
from sharding.annotate import annotate_tensor  # noqa: E402
from sharding.megatron import megatron_plan  # noqa: E402
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim  # noqa: E402

DATA, MODEL = 2, 4
FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama.onnx"


def lift(spec: ShardingSpec, batch_split: bool) -> ShardingSpec:
    """A spec over the MODEL devices, lifted onto the DATA x MODEL mesh.

    A weight is replicated over the data axis. An activation (batch first) is
    also split by batch over it: shard (d, k) lives on data row d, at the
    model devices of shard k.
    """
    rows = range(DATA) if batch_split else [None]
    groups, devices = [], []
    for row in rows:
        for shard in range(spec.num_shards):
            data_rows = range(DATA) if row is None else [row]
            members = tuple(sorted(d * MODEL + m for m in spec.devices_of_shard(shard) for d in data_rows))
            key = -(len(groups) + 1)
            groups.append((key, members))
            devices.append(key)
    dims = spec.sharded_dims
    if batch_split:
        dims = (ShardedDim(0, (SimpleShardedDim(DATA),)), *dims)
    return ShardingSpec(spec.tensor_name, dims, tuple(devices), tuple(sorted(groups)))


def data_parallel_plan(model: onnx.ModelProto) -> onnx.ModelProto:
    planned = megatron_plan(model, MODEL)
    config = planned.configuration[0]
    config.num_devices = DATA * MODEL
    weights = {init.name for init in planned.graph.initializer}
    for node in planned.graph.node:
        for node_config in node.device_configurations:
            for proto in node_config.sharding_spec:
                spec = ShardingSpec.from_proto(proto)
                proto.CopyFrom(lift(spec, batch_split=spec.tensor_name not in weights).to_proto())
    batch = ShardingSpec(
        "input_ids",
        (ShardedDim(0, (SimpleShardedDim(DATA),)),),
        devices=(-1, -2),
        groups=((-2, tuple(range(MODEL, 2 * MODEL))), (-1, tuple(range(MODEL)))),
    )
    annotate_tensor(planned, "input_ids", batch)
    return planned


def main() -> None:
    model = onnx.load(str(FIXTURE))
    annotated = data_parallel_plan(model)
    mesh = Mesh(np.array(jax.devices()[: DATA * MODEL]).reshape(DATA, MODEL), ("data", "model"))
    compiled = onnx2jax.compile(annotated, mesh)
    input_ids = np.random.default_rng(0).integers(0, 256, (4, 16)).astype(np.int64)
    (logits,) = compiled(input_ids)
    (reference,) = onnx2jax.translate(model)(input_ids)
    diff = float(np.max(np.abs(np.asarray(logits) - np.asarray(reference))))
    print(f"mesh {dict(mesh.shape)}; logits sharding {logits.sharding.spec}")
    print("collectives:", count_collectives(compiled.compiled_text(input_ids)))
    print(f"max |sharded - unsharded| = {diff:.3g}")
    assert diff < 1e-4


if __name__ == "__main__":
    main()
