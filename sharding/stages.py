"""Pipeline stages: where they come from, which devices run them, writing them into a model.

Three sources, one result (node -> stage, stage -> device group):

* ``pipeline_stage`` fields of ``NodeDeviceConfigurationProto`` as written
  (`read_stages`);
* PopRT's sharding points (`stages_from_points`, `load_points_yaml`): the
  two dicts of its ``Sharder`` (``sharding_info={node: device}``,
  ``pipelining_info={node: stage}``), walked with PopRT's algorithm
  (`walk_points`);
* an automatic cut (`auto_stages`, in :mod:`sharding.stage_cut`), balanced by estimated time,
  made only where one activation crosses (the residual stream).

A point's ``device`` is a *device group*: with N devices and G distinct
groups each group is N/G consecutive configuration devices (`device_groups`),
so tensor parallelism can run inside a stage. The groups are written into the
model's ``metadata_props`` under ``onnx2jax.stage_devices.<configuration>``
(JSON ``{stage: [devices]}``); a model without that key gets its groups from
the devices its specs name, else an even split (`stage_devices`).

Framework-neutral: onnx and numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from sharding.annotate import add_configuration, set_stage
from sharding.partition import GraphIndex, Partition, partition, require_unique_names
from sharding.shapes import node_inputs
from sharding.stage_cut import Cut, auto_stages
from sharding.model_configs import read_model_configs

METADATA_KEY = "onnx2jax.stage_devices"


@dataclass(frozen=True)
class StageAssignment:
    """Which stage and which device group each node belongs to.

    Attributes:
        stage: node name -> pipeline stage (>= 0; ids need not be contiguous).
        group: stage -> device group id (PopRT's ``device``), one per stage.
    """

    stage: Mapping[str, int]
    group: Mapping[int, int]

    @classmethod
    def one_group_per_stage(cls, stage: Mapping[str, int]) -> StageAssignment:
        """Stages each on their own device group (as `auto_stages` cuts them)."""
        return cls(dict(stage), {s: s for s in set(stage.values())})


# ---------------------------------------------------------------------------
# PopRT's sharding points
# ---------------------------------------------------------------------------


def walk_points(graph: onnx.GraphProto, points: Mapping[str, int]) -> dict[str, int]:
    """PopRT's manual-sharding walk: a value (device or stage) for every node.

    Points are taken in topological order. From each, walk towards the
    graph's inputs; every node reached that has no value yet takes the
    point's value; a branch stops at graph inputs (and initializers) and at
    nodes that already have a value. Nodes left over take the largest value
    given + 1. Several points may share a value.

    Raises:
        ValueError: duplicate node names, a point that names no node, or a
            negative value.
    """
    require_unique_names(graph)
    index = GraphIndex.of(graph)
    position = {index.nodes[i].name: rank for rank, i in enumerate(index.topological_order())}
    unknown = sorted(set(points) - set(position))
    if unknown:
        raise ValueError(f"sharding points name nodes that are not in the graph: {unknown}")
    negative = sorted((n, v) for n, v in points.items() if _int(v, n) < 0)
    if negative:
        raise ValueError("negative device or stage at sharding points: " + ", ".join(f"{n}={v}" for n, v in negative))
    by_name = {node.name: i for i, node in enumerate(index.nodes)}
    value: dict[str, int] = {}
    for point in sorted(points, key=position.__getitem__):
        stack = [point]
        while stack:
            name = stack.pop()
            if name in value:
                continue
            value[name] = int(points[point])
            for tensor in node_inputs(index.nodes[by_name[name]]):
                producer = index.producer.get(tensor)
                if producer is not None and index.nodes[producer].name not in value:
                    stack.append(index.nodes[producer].name)
    leftover = max(value.values(), default=-1) + 1
    return {n.name: value.get(n.name, leftover) for n in index.nodes}


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"sharding point {where!r}: device and stage must be ints, got {value!r}")
    return int(value)


def stages_from_points(
    graph: onnx.GraphProto,
    sharding_info: Mapping[str, int],
    pipelining_info: Mapping[str, int] | None = None,
) -> StageAssignment:
    """Stages and device groups from PopRT ``Sharder``'s two dicts.

    ``sharding_info`` gives each point's device (group), ``pipelining_info``
    its stage; each is walked with `walk_points`. Without
    ``pipelining_info`` the stages are the devices (plain model parallelism,
    run in device order).

    Raises:
        ValueError: as `walk_points`, or a stage whose nodes fall on
            different device groups (a stage is one program on one group).
    """
    devices = walk_points(graph, sharding_info)
    stages = walk_points(graph, pipelining_info) if pipelining_info else dict(devices)
    group: dict[int, int] = {}
    spans: dict[int, set[int]] = {}
    for name, stage in stages.items():
        spans.setdefault(stage, set()).add(devices[name])
        group.setdefault(stage, devices[name])
    split = {s: sorted(g) for s, g in spans.items() if len(g) > 1}
    if split:
        raise ValueError(
            "each stage must run on one device group, but "
            + "; ".join(f"stage {s} has nodes on devices {g}" for s, g in sorted(split.items()))
            + " (give the points of a stage the same device)"
        )
    return StageAssignment(stages, group)


def load_points_yaml(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """PopRT's shard.yaml (a list of ``{node, device, stage}``) as ``(sharding_info, pipelining_info)``.

    Raises:
        ValueError: not a list of mappings with a ``node`` and int ``device``/``stage``.
    """
    import yaml

    data = yaml.safe_load(text)
    if not isinstance(data, list):
        raise ValueError("a sharding-points YAML is a list of {node, device, stage} entries")
    sharding_info, pipelining_info = {}, {}
    for position, entry in enumerate(data):
        if not isinstance(entry, dict) or "node" not in entry:
            raise ValueError(f"entry {position}: expected a mapping with 'node', got {entry!r}")
        extra = set(entry) - {"node", "device", "stage"}
        if extra:
            raise ValueError(f"entry {position} ({entry['node']}): unknown keys {sorted(extra)}")
        node = str(entry["node"])
        if node in sharding_info or node in pipelining_info:
            raise ValueError(f"node {node!r} is listed twice")
        if "device" in entry:
            sharding_info[node] = _int(entry["device"], node)
        if "stage" in entry:
            pipelining_info[node] = _int(entry["stage"], node)
    if not sharding_info:
        sharding_info = dict(pipelining_info)  # stages only: one group per stage
    return sharding_info, pipelining_info


# ---------------------------------------------------------------------------
# Device groups and reading/writing stages
# ---------------------------------------------------------------------------


def device_groups(groups: Sequence[int], num_devices: int | None) -> dict[int, tuple[int, ...]]:
    """Configuration devices of each group id: N/G consecutive devices, groups in increasing id order.

    Without ``num_devices`` each group is one device.

    Raises:
        ValueError: ``num_devices`` is not a multiple of the number of groups.
    """
    distinct = sorted(set(groups))
    if num_devices is None:
        return {g: (rank,) for rank, g in enumerate(distinct)}
    if num_devices % len(distinct):
        raise ValueError(
            f"{num_devices} devices do not split evenly over {len(distinct)} device groups {distinct}"
        )
    size = num_devices // len(distinct)
    return {g: tuple(range(rank * size, (rank + 1) * size)) for rank, g in enumerate(distinct)}


def write_stages(
    model: onnx.ModelProto,
    stage_of: Mapping[str, int],
    devices: Mapping[int, Sequence[int]],
    configuration: str,
) -> None:
    """Writes ``pipeline_stage`` on every node and the stage -> devices map (in place).

    Adds the configuration (as many devices as the groups use) when missing.

    Raises:
        ValueError: a negative stage, nodes without a stage, a backward edge
            (see `sharding.partition.partition`), or a stage without devices.
    """
    partition(model.graph, stage_of)  # raises on every structural problem first
    missing = sorted(set(stage_of.values()) - set(devices))
    if missing:
        raise ValueError(f"stages {missing} have no devices")
    num_devices = max(d for group in devices.values() for d in group) + 1
    add_configuration(model, configuration, num_devices)
    for node, stage in stage_of.items():
        set_stage(model, node, int(stage), configuration)
    key = f"{METADATA_KEY}.{configuration}"
    for prop in list(model.metadata_props):
        if prop.key == key:
            model.metadata_props.remove(prop)
    value = json.dumps({str(s): list(map(int, devices[s])) for s in sorted(set(stage_of.values()))})
    model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


def annotate_stages(
    model: onnx.ModelProto,
    assignment: StageAssignment,
    num_devices: int | None = None,
    configuration: str = "pp",
    *,
    tensor_parallel: bool = False,
    gqa: str = "replicate",
) -> onnx.ModelProto:
    """A copy of ``model`` with its stages written, optionally Megatron inside each device group.

    Args:
        model: The model (node names unique); not modified.
        assignment: From `stages_from_points`, or
            ``StageAssignment.one_group_per_stage(auto_stages(...)[0])``.
        num_devices: Devices of the configuration, split evenly over the
            device groups (`device_groups`); None: one device per group.
        configuration: Name of the configuration to write.
        tensor_parallel: Apply `sharding.megatron.megatron_plan` inside each
            group (needs ``num_devices``).
        gqa: As for `megatron_plan`.

    Raises:
        ValueError: as `write_stages` and `device_groups`; ``tensor_parallel``
            without ``num_devices``.
    """
    from sharding.megatron import megatron_plan

    groups = device_groups(list(assignment.group.values()), num_devices)
    devices = {s: groups[g] for s, g in assignment.group.items()}
    if tensor_parallel:
        if num_devices is None:
            raise ValueError("tensor parallelism inside stages needs num_devices")
        ways = len(next(iter(devices.values())))
        node_devices = {n: devices[s] for n, s in assignment.stage.items()}
        result = megatron_plan(model, ways, configuration, gqa=gqa, node_devices=node_devices)
    else:
        result = onnx.ModelProto()
        result.CopyFrom(model)
    write_stages(result, assignment.stage, devices, configuration)
    return result


def read_stages(model: onnx.ModelProto, configuration: str) -> dict[str, int]:
    """``pipeline_stage`` of the nodes that have one, for ``configuration``."""
    configs = read_model_configs(model).get(configuration, {})
    return {name: c.pipeline_stage for name, c in configs.items() if c.pipeline_stage is not None}


def has_stages(model: onnx.ModelProto, configuration: str) -> bool:
    """Whether any node has a ``pipeline_stage`` for ``configuration``."""
    for node in model.graph.node:
        for proto in node.device_configurations:
            if proto.configuration_id == configuration and proto.HasField("pipeline_stage"):
                return True
    return False


def stage_devices(model: onnx.ModelProto, configuration: str, stages: Sequence[int], num_devices: int) -> dict[int, tuple[int, ...]]:
    """Configuration devices of each stage.

    From the ``onnx2jax.stage_devices.<configuration>`` metadata if present;
    else the union of the devices named by a stage's specs; else the stages
    without specs split the devices evenly, in stage order.

    Raises:
        ValueError: the metadata is malformed or misses a stage, or the
            devices do not split evenly over the stages that need a default.
    """
    key = f"{METADATA_KEY}.{configuration}"
    for prop in model.metadata_props:
        if prop.key == key:
            try:
                data = {int(k): tuple(int(d) for d in v) for k, v in json.loads(prop.value).items()}
            except (ValueError, TypeError, AttributeError) as e:
                raise ValueError(f"metadata {key!r} is not a JSON {{stage: [devices]}} map: {e}") from None
            missing = sorted(set(stages) - set(data))
            if missing:
                raise ValueError(f"metadata {key!r} gives no devices for stages {missing}")
            bad = sorted({d for s in stages for d in data[s] if not 0 <= d < num_devices})
            if bad:
                raise ValueError(f"metadata {key!r} names devices {bad} outside the configuration's {num_devices}")
            return {s: data[s] for s in stages}
    configs = read_model_configs(model).get(configuration, {})
    named: dict[int, set[int]] = {}
    stage_of = read_stages(model, configuration)
    for node, config in configs.items():
        for spec in config.specs:
            if node in stage_of:
                named.setdefault(stage_of[node], set()).update(spec.all_devices())
    result = {s: tuple(sorted(named[s])) for s in stages if s in named}
    rest = [s for s in stages if s not in result]
    if rest:
        if num_devices % len(rest):
            raise ValueError(
                f"stages {rest} name no devices and {num_devices} devices do not split evenly over them; "
                f"write the stages' devices with `onnx2jax annotate --stages` (metadata {key!r})"
            )
        size = num_devices // len(rest)
        for rank, s in enumerate(rest):
            result[s] = tuple(range(rank * size, (rank + 1) * size))
    return result


def model_partition(model: onnx.ModelProto, configuration: str) -> Partition:
    """The stage partition written in ``model`` (see `sharding.partition.partition`)."""
    return partition(model.graph, read_stages(model, configuration))


__all__ = [
    "Cut",
    "annotate_stages",
    "METADATA_KEY",
    "StageAssignment",
    "auto_stages",
    "device_groups",
    "has_stages",
    "load_points_yaml",
    "model_partition",
    "read_stages",
    "stage_devices",
    "stages_from_points",
    "walk_points",
    "write_stages",
]
