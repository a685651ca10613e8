"""Automatic plans (issue 31): the fastest layout for a model, devices and a workload, by search.

`analysis` evaluates a candidate's specs as data over one shape-inferred graph,
`candidates` lists the layouts (data x tensor, the patterns' choices),
`pipelines` the pipeline x tensor ones weighed where nothing else fits, `cost`
predicts their time and memory, `search` picks one (`auto_plan`), `errors`
names the requests no layout meets. docs/auto-plans.md is the guide.

The package imports lazily (:mod:`sharding._lazy`): importing `errors` (as ``onnx2jax.errors`` does) does
not load the search.
"""

from typing import TYPE_CHECKING

from sharding._lazy import lazy_package

lazy_package(
    __name__,
    {  # name -> module that defines it
        "DEFAULT_RATES": "sharding.auto.cost",
        "Rates": "sharding.auto.cost",
        "AutoPlanError": "sharding.auto.errors",
        "DeviceSplitError": "sharding.auto.errors",
        "MemoryLimitError": "sharding.auto.errors",
        "MeshShapeError": "sharding.auto.errors",
        "AutoReport": "sharding.auto.search",
        "auto_plan": "sharding.auto.search",
    },
)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the package imports each name on first use
    from sharding.auto.cost import DEFAULT_RATES as DEFAULT_RATES
    from sharding.auto.cost import Rates as Rates
    from sharding.auto.errors import AutoPlanError as AutoPlanError
    from sharding.auto.errors import DeviceSplitError as DeviceSplitError
    from sharding.auto.errors import MemoryLimitError as MemoryLimitError
    from sharding.auto.errors import MeshShapeError as MeshShapeError
    from sharding.auto.search import AutoReport as AutoReport
    from sharding.auto.search import auto_plan as auto_plan
