"""The Megatron tensor-parallel plan for transformer graphs (:mod:`sharding.megatron.plan`) and its parts.

``graph`` indexes the model, ``linears`` finds and pairs the linears, ``parts`` cuts fused projections,
``pairs`` sizes each column/row pair, ``specs`` writes the specs, ``embeddings`` handles embeddings and
the LM head.

The package imports lazily (:mod:`sharding._lazy`): importing one part (``sharding.auto.analysis`` reads
`graph`) does not load the plan.
"""

from typing import TYPE_CHECKING

from sharding._lazy import lazy_package

lazy_package(
    __name__,
    {  # name -> module that defines it
        "megatron_layout": "sharding.megatron.plan",
        "megatron_plan": "sharding.megatron.plan",
    },
)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the package imports each name on first use
    from sharding.megatron.plan import megatron_layout as megatron_layout
    from sharding.megatron.plan import megatron_plan as megatron_plan
