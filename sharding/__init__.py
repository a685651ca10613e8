"""The ONNX multi-device formalism, framework-neutral (onnx + numpy only, never jax).

Typed specs and their proto form (`spec`), a model's configurations and
node annotations as typed values (`model_configs`), a short text notation (`text`),
structural validation (`validate`), shard geometry with host-side split and
merge (`tiles`), nanotron's split configs (`nanotron`), text pictures
(`visualize`) and what ``explain --plot`` draws, as data (`tile_map`).

The package imports lazily (:mod:`sharding._lazy`, as ``onnx2jax`` does): a name of ``__all__`` is imported
from its module on first use, so that importing one submodule (``sharding.shapes`` on the runtime's path) does
not import every other (the checker, the automatic planner, the Megatron planner).
"""

from typing import TYPE_CHECKING

from sharding._lazy import lazy_package

lazy_package(
    __name__,
    {  # name -> module that defines it
        "Diagnostic": "sharding.diagnostics",
        "ShardingError": "sharding.diagnostics",
        "ChunkedSplit": "sharding.nanotron",
        "SplitConfig": "sharding.nanotron",
        "contiguous_permutation": "sharding.nanotron",
        "spec_from_split_config": "sharding.nanotron",
        "DeviceConfiguration": "sharding.model_configs",
        "NodeConfig": "sharding.model_configs",
        "Placement": "sharding.spec",
        "ShardedDim": "sharding.spec",
        "ShardingSpec": "sharding.spec",
        "SimpleShardedDim": "sharding.spec",
        "device_configurations": "sharding.model_configs",
        "read_model_configs": "sharding.model_configs",
        "same_placement": "sharding.spec",
        "SpecSyntaxError": "sharding.text",
        "format_spec": "sharding.text",
        "parse_spec": "sharding.text",
        "Region": "sharding.tiles",
        "device_regions": "sharding.tiles",
        "merge": "sharding.tiles",
        "merge_regions": "sharding.tiles",
        "split": "sharding.tiles",
        "split_regions": "sharding.tiles",
        "tile_assignment": "sharding.tiles",
        "require_valid": "sharding.validate",
        "validate_model": "sharding.validate",
        "render_tiles": "sharding.visualize",
        "add_configuration": "sharding.annotate",
        "annotate_tensor": "sharding.annotate",
        "describe_plan": "sharding.annotate",
        "set_spec": "sharding.annotate",
        "set_stage": "sharding.annotate",
        "megatron_layout": "sharding.megatron",
        "megatron_plan": "sharding.megatron",
        "check": "sharding.check",
        "auto_plan": "sharding.auto",
        "Inference": "sharding.infer",
        "NodeShardings": "sharding.infer",
        "infer": "sharding.stage_infer",
    },
)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the package imports each name on first use
    from sharding.diagnostics import Diagnostic as Diagnostic
    from sharding.diagnostics import ShardingError as ShardingError
    from sharding.nanotron import ChunkedSplit as ChunkedSplit
    from sharding.nanotron import SplitConfig as SplitConfig
    from sharding.nanotron import contiguous_permutation as contiguous_permutation
    from sharding.nanotron import spec_from_split_config as spec_from_split_config
    from sharding.model_configs import DeviceConfiguration as DeviceConfiguration
    from sharding.model_configs import NodeConfig as NodeConfig
    from sharding.spec import Placement as Placement
    from sharding.spec import ShardedDim as ShardedDim
    from sharding.spec import ShardingSpec as ShardingSpec
    from sharding.spec import SimpleShardedDim as SimpleShardedDim
    from sharding.model_configs import device_configurations as device_configurations
    from sharding.model_configs import read_model_configs as read_model_configs
    from sharding.spec import same_placement as same_placement
    from sharding.text import SpecSyntaxError as SpecSyntaxError
    from sharding.text import format_spec as format_spec
    from sharding.text import parse_spec as parse_spec
    from sharding.tiles import Region as Region
    from sharding.tiles import device_regions as device_regions
    from sharding.tiles import merge as merge
    from sharding.tiles import merge_regions as merge_regions
    from sharding.tiles import split as split
    from sharding.tiles import split_regions as split_regions
    from sharding.tiles import tile_assignment as tile_assignment
    from sharding.validate import require_valid as require_valid
    from sharding.validate import validate_model as validate_model
    from sharding.visualize import render_tiles as render_tiles
    from sharding.annotate import add_configuration as add_configuration
    from sharding.annotate import annotate_tensor as annotate_tensor
    from sharding.annotate import describe_plan as describe_plan
    from sharding.annotate import set_spec as set_spec
    from sharding.annotate import set_stage as set_stage
    from sharding.megatron import megatron_layout as megatron_layout
    from sharding.megatron import megatron_plan as megatron_plan
    from sharding.check import check as check
    from sharding.auto import auto_plan as auto_plan
    from sharding.infer import Inference as Inference
    from sharding.infer import NodeShardings as NodeShardings
    from sharding.stage_infer import infer as infer
