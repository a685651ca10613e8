"""The ONNX multi-device formalism, framework-neutral (onnx + numpy only, never jax).

Typed specs and their proto form (`spec`), a short text notation (`text`),
structural validation (`validate`), shard geometry with host-side split and
merge (`tiles`), nanotron's split configs (`nanotron`), text pictures
(`visualize`) and what ``explain --plot`` draws, as data (`tile_map`).
"""

from .diagnostics import Diagnostic as Diagnostic
from .diagnostics import ShardingError as ShardingError
from .nanotron import ChunkedSplit as ChunkedSplit
from .nanotron import SplitConfig as SplitConfig
from .nanotron import contiguous_permutation as contiguous_permutation
from .nanotron import spec_from_split_config as spec_from_split_config
from .spec import DeviceConfiguration as DeviceConfiguration
from .spec import NodeConfig as NodeConfig
from .spec import Placement as Placement
from .spec import ShardedDim as ShardedDim
from .spec import ShardingSpec as ShardingSpec
from .spec import SimpleShardedDim as SimpleShardedDim
from .spec import device_configurations as device_configurations
from .spec import read_model_configs as read_model_configs
from .spec import same_placement as same_placement
from .text import SpecSyntaxError as SpecSyntaxError
from .text import format_spec as format_spec
from .text import parse_spec as parse_spec
from .tiles import Region as Region
from .tiles import device_regions as device_regions
from .tiles import merge as merge
from .tiles import merge_regions as merge_regions
from .tiles import split as split
from .tiles import split_regions as split_regions
from .tiles import tile_assignment as tile_assignment
from .validate import require_valid as require_valid
from .validate import validate_model as validate_model
from .visualize import render_tiles as render_tiles
from .annotate import (add_configuration as add_configuration, annotate_tensor as annotate_tensor, describe_plan as describe_plan, set_spec as set_spec, set_stage as set_stage)  # noqa: E501
from .megatron import megatron_layout as megatron_layout
from .megatron import megatron_plan as megatron_plan
from .check import check as check
from .infer import Inference as Inference
from .infer import NodeShardings as NodeShardings
from .infer import infer as infer
