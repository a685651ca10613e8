"""Choosing each slot's next token with that slot's own sampling parameters, all of them data.

Unlike :func:`onnx2jax.runtime.sampling.choose` (one setting for the whole batch, greedy-or-sampled compiled in),
every row here has its own temperature (0: greedy), top-k, top-p, repetition penalty and seed, so requests with
different parameters share one compiled program. A row's random key is ``fold_in(PRNGKey(seed), n)`` with n the
number of tokens the request has generated: the same seed gives the same tokens whatever runs beside it, and
after a preemption.

A row's parameters travel packed as int32 columns (:func:`sampling_columns`), in the one int32 array a serving
call takes, and :func:`pick` unpacks them itself, inside the branch that samples where it can. That is for XLA
CPU's runtime: it starts a program by running every kernel that reads only the arguments, and where more than a
few are ready at once it hands half of them to its intra-op thread pool, to be waited for. Unpacked at the top
of the program, the columns were five such kernels of a few nanoseconds each, and the hand-off (waking a pool
thread, a context switch each way) cost a one-row decode step of the test model ~20 us of its ~135, more on a
busy machine (bench/RESULTS.md, "Serving, fixed cost per call").
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.runtime.sampling import first_max, penalize

_INTS, _FLOATS = ("top_k", "seed", "step"), ("temperature", "top_p", "penalty")
SAMPLING_FIELDS = len(_INTS) + len(_FLOATS)
"""Columns of a packed row that hold its sampling parameters (:func:`sampling_columns`)."""

IDLE_ROW = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "penalty": 1.0, "seed": 0, "step": 0}
"""The sampling parameters of an idle row."""


def sampling_columns(rows: list[dict[str, Any]]) -> np.ndarray:
    """Per-row sampling parameters as int32 columns [len(rows), SAMPLING_FIELDS]: top_k, seed (uint32 bits),
    step, then temperature, top_p, penalty as float32 bits (:func:`unpack` reads them back)."""
    ints = np.array([[r[k] for k in _INTS] for r in rows], np.int64).astype(np.uint32).view(np.int32)
    floats = np.array([[r[k] for k in _FLOATS] for r in rows], np.float32).view(np.int32)
    return np.concatenate([ints.reshape(len(rows), -1), floats.reshape(len(rows), -1)], axis=1)


STEP_COLUMN = _INTS.index("step")
"""The column of :func:`sampling_columns` that holds the request's generated-token count (the only one that
changes from step to step: the engine keeps each request's columns and sets this one)."""

IDLE_COLUMNS = sampling_columns([IDLE_ROW])[0]
"""An idle row's sampling columns."""


def unpack(columns: jax.Array) -> dict[str, jax.Array]:
    """The traced inverse of :func:`sampling_columns`: ``columns`` [B, SAMPLING_FIELDS] int32 -> ``temperature``
    [B] f32, ``top_k`` [B] i32 (0: all), ``top_p`` [B] f32, ``penalty`` [B] f32, ``seed`` [B] u32, ``step``
    [B] i32."""
    f32 = jax.lax.bitcast_convert_type(columns[:, len(_INTS):], jnp.float32)
    return {"top_k": columns[:, 0], "seed": jax.lax.bitcast_convert_type(columns[:, 1], jnp.uint32),
            "step": columns[:, 2], "temperature": f32[:, 0], "top_p": f32[:, 1], "penalty": f32[:, 2]}


def _field(columns: jax.Array, name: str) -> jax.Array:
    """One float field of :func:`unpack`, alone (so that XLA fuses it into the kernel that reads it)."""
    return jax.lax.bitcast_convert_type(columns[:, len(_INTS) + _FLOATS.index(name)], jnp.float32)


def pick(logits: jax.Array, seen: jax.Array, columns: jax.Array, step: jax.Array | int = 0) -> jax.Array:
    """The next token of each row, int32 [B], from ``logits`` [B, V], the tokens each row has ``seen`` [B, V]
    (for the repetition penalty) and its packed sampling ``columns`` [B, SAMPLING_FIELDS]
    (:func:`sampling_columns`), ``step`` tokens past the generated count they hold."""
    logits = penalize(logits.astype(jnp.float32), seen, _field(columns, "penalty"))
    greedy = first_max(logits)

    def sample(columns: jax.Array) -> jax.Array:
        rows = unpack(columns)
        return _sample(logits, greedy, {**rows, "step": rows["step"] + step})

    # The sort, the softmaxes and the random draws only run where a row samples (a branch, not a mask).
    return jax.lax.cond(jnp.any(_field(columns, "temperature") > 0), sample, lambda _: greedy, columns)


def _sample(logits: jax.Array, greedy: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
    """:func:`pick` where some row samples: each sampling row's token, the greedy rows' from ``greedy``."""
    temperature = rows["temperature"]
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    vocab = logits.shape[-1]
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]
    k = jnp.where(rows["top_k"] > 0, jnp.minimum(rows["top_k"], vocab), vocab)
    kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)  # [B, 1]: the k-th largest
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the probability of the more likely tokens
    kept = jnp.where(before < rows["top_p"][:, None], ordered, jnp.inf)  # the most likely is always kept
    threshold = jnp.maximum(jnp.min(kept, axis=-1, keepdims=True), kth)
    scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
    keys = jax.vmap(lambda s, n: jax.random.fold_in(jax.random.PRNGKey(s), n))(rows["seed"], rows["step"])
    sampled = jax.vmap(lambda key, row: jax.random.categorical(key, row))(keys, scaled).astype(jnp.int32)
    return jnp.where(temperature > 0, sampled, greedy)
