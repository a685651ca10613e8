"""The XLA options onnx2jax compiles every executable with.

They go to ``jax.jit(..., compiler_options=...)``, so they apply to onnx2jax's
own executables only: the user's ``XLA_FLAGS`` and every other jitted function
of the process keep XLA's defaults.

XLA CPU (jaxlib 0.10.2) turns a reduction whose operand is a dot or
convolution with a broadcast operand (weights that are one constant, as in
ONNX's "light" test models) into one YNNPACK ``REDUCE`` fusion, and that
fusion returns garbage: ``sum(conv(ones(1, 64, 8, 8), full(64, 64, 1, 1)))``
gives 1.7e+27 or -5.2e+07 instead of 4096, a different value at each compile
(docs/known-issues.md). Every other YNNPACK fusion XLA enables by default
(single dots and convolutions) stays on.
"""

from __future__ import annotations

import os

YNN_FUSION_FLAG = "xla_cpu_experimental_ynn_fusion_type"

YNN_FUSION_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
"""XLA's default YNNPACK fusion types for CPU (individual dots, convolutions, reductions) less ``REDUCE``."""


IN_PLACE_LOOP_FLAG = "xla_cpu_copy_insertion_use_region_analysis"
"""XLA CPU's copy insertion, by default, copies every buffer a ``while`` body both reads and updates in place
(``dynamic_update_slice``) twice per iteration, whatever the order of the read and the write: a decode loop
copied its whole KV cache twice a step (GPT-2 small at 130 positions: 48 copies, 10 MB of temporary memory per
call, that glibc's per-thread arenas kept, one more each few steps). With region analysis it proves the reads
come first and updates the cache in place (no copy, 0.8 MB of temporaries; ``bench/RESULTS.md``)."""


def compiler_options(platform: str, *, in_place_loops: bool = False) -> dict[str, str | bool]:
    """The per-executable XLA options for a program that runs on ``platform`` ("cpu", "gpu", ...).

    A user who chose the YNNPACK fusion types in ``XLA_FLAGS`` keeps that choice. ``in_place_loops``: a program
    whose loop carries buffers it updates in place (generation's decode loop and its cache) gets
    `IN_PLACE_LOOP_FLAG` on CPU, unless the user set it in ``XLA_FLAGS``.
    """
    if platform != "cpu":
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    options: dict[str, str | bool] = {} if YNN_FUSION_FLAG in flags else {YNN_FUSION_FLAG: YNN_FUSION_TYPES}
    if in_place_loops and IN_PLACE_LOOP_FLAG not in flags:
        options[IN_PLACE_LOOP_FLAG] = True
    return options
