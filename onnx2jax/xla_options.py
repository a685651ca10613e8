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


def compiler_options(platform: str) -> dict[str, str]:
    """The per-executable XLA options for a program that runs on ``platform`` ("cpu", "gpu", ...).

    A user who chose the YNNPACK fusion types in ``XLA_FLAGS`` keeps that choice.
    """
    if platform != "cpu" or YNN_FUSION_FLAG in os.environ.get("XLA_FLAGS", ""):
        return {}
    return {YNN_FUSION_FLAG: YNN_FUSION_TYPES}
