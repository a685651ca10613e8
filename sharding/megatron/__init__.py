"""The Megatron tensor-parallel plan for transformer graphs (:mod:`sharding.megatron.plan`) and its parts.

``graph`` indexes the model, ``linears`` finds and pairs the linears, ``parts`` cuts fused projections,
``pairs`` sizes each column/row pair, ``specs`` writes the specs, ``embeddings`` handles embeddings and
the LM head.
"""

from sharding.megatron.plan import megatron_layout as megatron_layout
from sharding.megatron.plan import megatron_plan as megatron_plan
