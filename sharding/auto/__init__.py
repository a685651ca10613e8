"""Automatic plans (issue 31): the fastest layout for a model, devices and a workload, by search.

`analysis` evaluates a candidate's specs as data over one shape-inferred graph,
`candidates` lists the layouts (data x tensor, the patterns' choices),
`pipelines` the pipeline x tensor ones weighed where nothing else fits, `cost`
predicts their time and memory, `search` picks one (`auto_plan`), `errors`
names the requests no layout meets. docs/auto-plans.md is the guide.
"""

from sharding.auto.cost import DEFAULT_RATES as DEFAULT_RATES
from sharding.auto.cost import Rates as Rates
from sharding.auto.errors import AutoPlanError as AutoPlanError
from sharding.auto.errors import DeviceSplitError as DeviceSplitError
from sharding.auto.errors import MemoryLimitError as MemoryLimitError
from sharding.auto.errors import MeshShapeError as MeshShapeError
from sharding.auto.search import AutoReport as AutoReport
from sharding.auto.search import auto_plan as auto_plan
