"""Generation's programs lowered without data: the prefill and the decode step for a TPU target (issue 41 item 6).

A decoder loaded for a target (``onnx2jax.load(path, target="tpu:v5e:2x4")``) or on a mesh of compile-only
devices has no device to place its parameters or its cache on; :func:`lower_generation` lowers the two
programs a run calls over ShapeDtypeStructs with their planned shardings instead: the parameters
(``abstract_params``), the cache (``CachePlacement.abstract_cache``), and the decode step's state as the
prefill's compiled program returns it (its output shardings), so the decode program is lowered at the
placements a run would hand it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from onnx2jax.runtime.sampling import Search

if TYPE_CHECKING:
    from onnx2jax.runtime.decoder import Decoder


def lower_generation(
    decoder: "Decoder", batch: int, width: int, max_length: int, search: Search | None = None
) -> tuple[jax.stages.Lowered, jax.stages.Lowered]:
    """(prefill, decode) of ``batch`` prompts ``width`` tokens wide, generating up to ``max_length`` tokens, lowered
    as :class:`~onnx2jax.runtime.generate.Generator` would call them (the same capacity, prefill width and
    sampling data), nothing placed. The prefill is compiled here (its output shardings are the decode step's
    input shardings); compile the decode with ``.compile()``."""
    search = search or Search()
    capacity = decoder.buffer_capacity(max_length)
    prefill_width = decoder.prefill_width(width, capacity)
    decoder.plan_prefill(batch, prefill_width, capacity)
    params = decoder.compiled.abstract_params
    cache = decoder.placement.abstract_cache(batch, capacity)
    sampling = {
        "key": jax.eval_shape(jax.random.PRNGKey, 0),
        "eos": jax.ShapeDtypeStruct((1,), jnp.int32),
        "pad": jax.ShapeDtypeStruct((), jnp.int32),
        **search.values(),
    }
    ids = jax.ShapeDtypeStruct((batch, prefill_width), jnp.int32)
    lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
    prefill = decoder.prefill(search).lower(params, cache, ids, lengths, sampling)
    shardings = prefill.compile().output_shardings
    cache, state, token = jax.tree.map(
        lambda info, sharding: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding),
        prefill.out_info, shardings,
    )
    decode = decoder.decode(search).lower(params, cache, state, token, jax.ShapeDtypeStruct((), jnp.int32))
    return prefill, decode


__all__ = ["lower_generation"]
