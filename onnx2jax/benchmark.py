"""onnx2jax against onnxruntime on the same model and inputs, timed in one process.

For each model: the first call of each runtime (onnx2jax: load + trace +
compile + run; onnxruntime: session creation + run), then a few warm-up calls
of each, then ``repeats`` rounds that call onnx2jax and onnxruntime
alternately, so that the noise of a shared machine hits both alike (with
onnxruntime's idle threads not spinning, which would otherwise starve the
onnx2jax call timed next). A row
keeps every per-call time; the table shows the median and the interquartile
range of each, their ratio (onnx2jax / onnxruntime: below 1, onnx2jax is
faster) and the largest difference between the two runtimes' outputs, so a
fast wrong answer does not pass unseen.

The persistent compilation cache is not turned on here: the first call is a
compile from scratch.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

import onnx2jax  # lazy: its names import jax on first use

COLUMNS = (
    "model", "inputs", "onnx2jax ms", "onnx2jax IQR ms", "onnxruntime ms", "onnxruntime IQR ms",
    "ratio", "onnx2jax first call s", "onnxruntime first call s", "max abs diff",
)


@dataclasses.dataclass
class Row:
    """One model at one input shape: every timed call of both runtimes, in seconds."""

    model: str
    shapes: str
    ours: list[float]
    theirs: list[float]
    ours_first: float
    theirs_first: float
    max_diff: float | None  # None when an output is not numeric

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def theirs_median(self) -> float:
        return statistics.median(self.theirs)

    @property
    def ratio(self) -> float:
        """onnx2jax's median per call over onnxruntime's: below 1, onnx2jax is faster."""
        return self.ours_median / self.theirs_median


def iqr(times: Sequence[float]) -> float:
    """Interquartile range (75th minus 25th percentile) of ``times``."""
    low, high = np.percentile(np.asarray(times), [25, 75])
    return float(high - low)


def alternate(ours: Callable[[], object], theirs: Callable[[], object], repeats: int,
              warmup: int) -> tuple[list[float], list[float]]:
    """Seconds per call of two callables after ``warmup`` calls each, called alternately ``repeats`` times."""
    first, second = alternate_all((ours, theirs), repeats, warmup)
    return first, second


def alternate_all(fns: Sequence[Callable[[], object]], repeats: int, warmup: int) -> list[list[float]]:
    """Seconds per call of each callable after ``warmup`` calls each, called in turn ``repeats`` times.

    One list of times per callable, in the order given; round-robin so that the
    noise of a shared machine hits every runtime alike.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return times


def bench_model(path: str | pathlib.Path, inputs: Mapping[str, np.ndarray], repeats: int = 50,
                warmup: int = 3, scan_layers: bool | str = "auto") -> Row:
    """Times onnx2jax and onnxruntime (CPU) on one model at ``inputs``; see the module docstring.

    ``scan_layers`` is :func:`onnx2jax.translate`'s (repeated layers as one lax.scan).
    """
    # jax and onnxruntime load here, not at import: ``onnx2jax bench --help`` stays fast
    import jax
    import onnxruntime as ort

    path = str(path)
    start = time.perf_counter()
    model = onnx2jax.translate(path, scan_layers=scan_layers)
    ours_out = jax.block_until_ready(model(**inputs))
    ours_first = time.perf_counter() - start
    start = time.perf_counter()
    session = ort.InferenceSession(path, _session_options(ort), providers=["CPUExecutionProvider"])
    theirs_out = session.run(None, dict(inputs))
    theirs_first = time.perf_counter() - start

    ours_times, theirs_times = alternate(
        lambda: jax.block_until_ready(model(**inputs)), lambda: session.run(None, dict(inputs)), repeats, warmup
    )
    return Row(
        model=pathlib.Path(path).stem,
        shapes=" ".join(f"{name}{list(np.shape(v))}" for name, v in inputs.items()),
        ours=ours_times,
        theirs=theirs_times,
        ours_first=ours_first,
        theirs_first=theirs_first,
        max_diff=_worst_diff(ours_out, theirs_out, max_abs_diff),
    )


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b|; NaN in both or equal infinities count as equal, any other NaN as inf."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):  # inf - inf
        diff = np.abs(a - b)
    return float(np.max(np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))))


def _session_options(ort):
    """onnxruntime's options with its idle intra-op threads not spinning.

    By default they busy-wait after each run, which starves the onnx2jax call
    timed next on a machine with few cores (bench/RESULTS.md: 7.3 ms per
    onnx2jax call with spinning, 1.1 ms without, on a 2-layer transformer).
    """
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _worst_diff(ours: Sequence, theirs: Sequence, diff: Callable[[np.ndarray, np.ndarray], float]) -> float | None:
    """Largest |difference| over the outputs; None if any output is not a numeric array."""
    arrays = [(np.asarray(a), np.asarray(b)) for a, b in zip(ours, theirs, strict=True)]
    if any(a.dtype.kind not in "biufc" or b.dtype.kind not in "biufc" for a, b in arrays):
        return None
    return max((diff(a, b) for a, b in arrays), default=0.0)


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table with :data:`COLUMNS`."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (
            r.model, r.shapes, f"{r.ours_median * 1e3:.4g}", f"{iqr(r.ours) * 1e3:.3g}",
            f"{r.theirs_median * 1e3:.4g}", f"{iqr(r.theirs) * 1e3:.3g}", f"{r.ratio:.3g}",
            f"{r.ours_first:.3g}", f"{r.theirs_first:.3g}",
            "-" if r.max_diff is None else f"{r.max_diff:.2g}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment_note(repeats: int, warmup: int) -> str:
    """One paragraph: how the figures were taken, and on what (versions, machine)."""
    import jax  # on use, not at import (see bench_model)
    import onnxruntime as ort

    device = jax.devices()[0]
    return (
        f"Median and interquartile range of {repeats} alternating calls after {warmup} warm-up calls; "
        f"first call = load + trace + compile + run (onnx2jax, no persistent cache) or session creation + run "
        f"(onnxruntime). onnx2jax {onnx2jax.__version__} on jax {jax.__version__} ({device.platform}: "
        f"{device.device_kind}, {jax.device_count()} device(s)); onnxruntime {ort.__version__} "
        f"CPUExecutionProvider (intra-op spinning off); Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPU(s)."
    )


def plot(rows: Sequence[Row], path: str) -> None:
    """Writes a PNG: per-call medians with interquartile bars, and first-call times, per model.

    Raises:
      ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    import matplotlib  # the optional ``plot`` extra, loaded only to plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.model}\n{r.shapes}" for r in rows]
    x = np.arange(len(rows))
    width = 0.38
    fig, (per_call, first) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(rows) + 4), 4.5))
    for offset, name, runs in ((-width / 2, "onnx2jax", [r.ours for r in rows]),
                               (width / 2, "onnxruntime", [r.theirs for r in rows])):
        low, median, high = (np.array([np.percentile(t, q) for t in runs]) * 1e3 for q in (25, 50, 75))
        per_call.bar(x + offset, median, width, yerr=[median - low, high - median], capsize=3, label=name)
    first.bar(x - width / 2, [r.ours_first for r in rows], width, label="onnx2jax")
    first.bar(x + width / 2, [r.theirs_first for r in rows], width, label="onnxruntime")
    for axis, title, unit in ((per_call, "per call, ms (median; bars: 25th-75th percentile)", "ms"),
                              (first, "first call, s (load + compile + run)", "s")):
        axis.set_xticks(x, labels, fontsize=7)
        axis.set_title(title)
        axis.set_ylabel(unit)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
