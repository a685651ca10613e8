"""A model's written annotations for one configuration, read once: what inference reads that no shape changes.

`sharding.infer.infer_graph` reads every node's `NodeDeviceConfigurationProto` and orders the graph before it
walks it; neither depends on the shapes the walk is typed with. A compile infers again at each call-shape
signature (a Reshape keeps a head split only where the batch is known), so it reads them once
(:func:`read_annotations`) and passes the result to each inference instead of reading them per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic
from sharding.model_configs import NodeConfig
from sharding.shapes import topological_order


@dataclasses.dataclass(frozen=True)
class WrittenAnnotations:
    """The annotations of one configuration, by node index, with the graph's order (both shape-independent).

    Attributes:
      configuration: the configuration they were read for.
      order: the graph's topological order (`sharding.shapes.topological_order`).
      by_index: each annotated node's `NodeConfig`, by its index in the graph.
      diagnostics: an error per annotation that could not be read (it is then ignored).
    """

    configuration: str
    order: tuple[int, ...]
    by_index: Mapping[int, NodeConfig]
    diagnostics: tuple[Diagnostic, ...]


def read_annotations(model: onnx.ModelProto, configuration: str) -> WrittenAnnotations:
    """Reads ``configuration``'s annotations of ``model``'s main graph and its order, as inference reads them."""
    diags: list[Diagnostic] = []
    by_index = annotations_by_index(model, configuration, diags)
    return WrittenAnnotations(configuration, tuple(topological_order(model.graph)), by_index, tuple(diags))


def annotations_by_index(
    model: onnx.ModelProto, configuration: str | None, diags: list[Diagnostic]
) -> dict[int, NodeConfig]:
    """Each node's annotation for ``configuration`` by node index; one that cannot be read is an error in
    ``diags`` and is left out."""
    found: dict[int, NodeConfig] = {}
    if configuration is None:
        return found
    for index, node in enumerate(model.graph.node):
        for proto in node.device_configurations:
            if proto.configuration_id != configuration:
                continue
            try:
                found[index] = NodeConfig.from_proto(proto)
            except (TypeError, ValueError) as e:
                diags.append(
                    Diagnostic(
                        code=codes.ANNOTATION_INVALID,
                        severity="error",
                        node=node.name,
                        op_type=node.op_type,
                        message=f"the annotation cannot be read ({e}); it is ignored",
                        hint="fix it (see the structural diagnostics)",
                    )
                )
            break
    return found


__all__ = ["WrittenAnnotations", "annotations_by_index", "read_annotations"]
