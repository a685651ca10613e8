"""The order a pipeline runs its (stage, micro-batch) steps in: a schedule object, separate from the stages.

:class:`~onnx2jax.runtime.pipeline.PipelineCompiled` issues its stage
programs in the order its schedule gives; JAX's asynchronous dispatch lets
steps on different devices overlap. A schedule for the forward pass only
needs each step after its predecessor stage's step of the same micro-batch;
1F1B and interleaved schedules (with backward steps) can take this place later.
"""

from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable


@runtime_checkable
class Schedule(Protocol):
    """Gives the (stage index, micro-batch index) steps of one call, in issue order."""

    def steps(self, stages: int, microbatches: int) -> Iterator[tuple[int, int]]: ...


class GPipe:
    """Fill-drain (GPipe): at clock tick t, stage k runs micro-batch t - k.

    The bubble fraction is (S-1)/(M+S-1) for S stages and M micro-batches.
    """

    def steps(self, stages: int, microbatches: int) -> Iterator[tuple[int, int]]:
        for tick in range(microbatches + stages - 1):
            for stage in range(stages):
                microbatch = tick - stage
                if 0 <= microbatch < microbatches:
                    yield stage, microbatch

    def __repr__(self) -> str:
        return "GPipe()"


def check_order(steps: list[tuple[int, int]], stages: int, microbatches: int) -> None:
    """Raises ValueError unless ``steps`` runs every (stage, micro-batch) once, each after its previous stage."""
    seen: set[tuple[int, int]] = set()
    for stage, microbatch in steps:
        if not (0 <= stage < stages and 0 <= microbatch < microbatches) or (stage, microbatch) in seen:
            raise ValueError(f"schedule step {(stage, microbatch)} is out of range or repeated")
        if stage and (stage - 1, microbatch) not in seen:
            raise ValueError(f"schedule runs stage {stage} of micro-batch {microbatch} before stage {stage - 1}")
        seen.add((stage, microbatch))
    if len(seen) != stages * microbatches:
        raise ValueError(f"schedule runs {len(seen)} steps; {stages} stages x {microbatches} micro-batches need all")


__all__ = ["GPipe", "Schedule", "check_order"]
