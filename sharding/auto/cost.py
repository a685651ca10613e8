"""The cost model: a candidate's predicted step time and memory per device, from its `Evaluation`.

* Communication: each collective inference predicts costs its kind's latency
  plus its bytes over its kind's bandwidth, the bytes a ring moves through
  one device of a group of ``g``: an all-reduce ``2 (g - 1) / g`` of its
  result, an all-gather or all-to-all ``(g - 1) / g``, a reduce-scatter
  ``g - 1`` times its (one-``g``-th) result, a collective-permute its result.
* Compute: the busiest device's product FLOPs at the backend's rate (measured while every device
  computes), plus a call's fixed overhead.
* Memory per device: parameters, plus activations (inference: twice the
  largest tensor a device holds; training: every activation, kept for the
  backward pass) and, for ``train``, the gradients and Adam's two moments
  (three more copies of the parameters).
* ``train`` runs the forward pass, then a backward pass of twice its FLOPs and
  the mirror of each tensor-parallel collective, then (data degree > 1) an
  all-reduce of the gradients over the data replicas.

The rates (`Rates`) come from the runtime's calibration
(`onnx2jax.runtime.calibration`: micro-benchmarks on the real backend, cached
per backend) or are `DEFAULT_RATES` when not calibrated; the report says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sharding.auto.analysis import KINDS, Collective, Evaluation

OBJECTIVES = ("latency", "throughput", "train")

_OPTIMIZER_COPIES = 3  # gradients and Adam's first and second moments


@dataclass(frozen=True)
class Rates:
    """A backend's measured (or default) rates.

    Attributes:
        latency: Seconds per collective, by kind.
        bandwidth: Bytes per second through one device, by kind.
        flops: Product FLOPs per second on one device, while every device computes (fake CPU
            devices share the host's cores).
        overhead: Seconds a call costs whatever it computes (dispatch, synchronisation).
        source: Where they come from (``"defaults"``, or the backend calibrated).
    """

    latency: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 2e-5))
    bandwidth: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 5e9))
    flops: float = 5e10
    overhead: float = 1e-4
    source: str = "defaults (not calibrated)"

    def to_json(self) -> dict:
        """A dict for a JSON cache."""
        return {"latency": self.latency, "bandwidth": self.bandwidth, "flops": self.flops, "overhead": self.overhead,
                "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> Rates:
        """Reads `to_json`'s dict back (kinds it lacks keep the defaults)."""
        base = cls()
        return cls(
            latency={**base.latency, **{k: float(v) for k, v in data.get("latency", {}).items()}},
            bandwidth={**base.bandwidth, **{k: float(v) for k, v in data.get("bandwidth", {}).items()}},
            flops=float(data.get("flops", base.flops)),
            overhead=float(data.get("overhead", base.overhead)),
            source=str(data.get("source", "a cache")),
        )


DEFAULT_RATES = Rates()


def moved_bytes(c: Collective) -> float:
    """Bytes a ring moves through one device for ``c`` (module docstring)."""
    g = max(c.group, 2)
    factor = {"all-reduce": 2 * (g - 1) / g, "all-gather": (g - 1) / g, "all-to-all": (g - 1) / g,
              "reduce-scatter": g - 1, "collective-permute": 1.0}[c.kind]
    return factor * c.bytes


def collective_seconds(c: Collective, rates: Rates) -> float:
    """One collective's predicted time."""
    return rates.latency[c.kind] + moved_bytes(c) / rates.bandwidth[c.kind]


@dataclass(frozen=True)
class Cost:
    """A candidate's predicted cost.

    Attributes:
        communication: Seconds in collectives per step.
        compute: Seconds of product FLOPs per step on the busiest device, plus the call's overhead.
        memory: Bytes per device (parameters, activations, optimizer state for ``train``).
        param_bytes: Parameter bytes on the device holding most.
    """

    communication: float
    compute: float
    memory: int
    param_bytes: int

    @property
    def seconds(self) -> float:
        """The predicted step time."""
        return self.communication + self.compute


def predict(evaluation: Evaluation, rates: Rates, objective: str, data: int = 1) -> Cost:
    """The cost of one step of ``objective`` for a candidate of data degree ``data``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    comm = sum(collective_seconds(c, rates) for c in evaluation.collectives)
    compute = evaluation.flops / rates.flops + rates.overhead
    params = evaluation.max_param_bytes
    if objective != "train":
        return Cost(comm, compute, params + 2 * evaluation.activation_peak, params)
    comm *= 2
    if data > 1:
        comm += collective_seconds(Collective("all-reduce", "", "gradients", params, data), rates)
    memory = params * (1 + _OPTIMIZER_COPIES) + evaluation.activation_total
    return Cost(comm, 3 * (compute - rates.overhead) + rates.overhead, memory, params)
