"""A bound on the executions in flight, where a mesh's devices are CPU devices of one host.

JAX dispatches asynchronously: a call returns before its program has run, so a loop of calls
(a decode loop, a benchmark) enqueues executions as fast as Python can. On XLA's CPU client the
devices of one host are threads of one process, and a collective (an all-reduce of a row-parallel
projection) is a rendezvous of those threads. With hundreds of sharded executions queued, the
threads of one execution drift apart, XLA's rendezvous waits 40 s for the missing participants
and then aborts the process (``Termination timeout for `all reduce RendezvousKey...``, SIGABRT),
reproducible in plain jax (``docs/known-issues.md``, "Thousands of sharded calls on CPU devices").

:class:`InFlight` keeps a call from running more than :data:`DEFAULT_BOUND` executions ahead: before
it returns a new result it waits for the one ``bound`` calls back, and forgets those already finished. The wait costs nothing while
the devices keep up (the result it waits for is done), and it never blocks the newest call. Meshes
of one device, and accelerators (each device its own stream), are left unbounded.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

DEFAULT_BOUND = 8  # 10,000 back-to-back TP-8 calls: 4 or 8 run through; 64 aborts (docs/known-issues.md)


class InFlight:
    """Remembers the last ``bound`` results of sharded CPU executions and waits for the oldest beyond it.

    Args:
      devices: the devices the executable runs on (``mesh.devices.flat``).
      bound: how many executions may be queued; ``None`` for :data:`DEFAULT_BOUND`.
    """

    def __init__(self, devices: Sequence[Any], bound: int | None = None):
        devices = list(devices)
        self.active = len(devices) > 1 and all(getattr(d, "platform", None) == "cpu" for d in devices)
        self.bound = DEFAULT_BOUND if bound is None else bound
        if self.bound < 1:
            raise ValueError(f"the bound on executions in flight must be at least 1, got {self.bound}")
        self._queued: collections.deque = collections.deque()

    def admit(self, outputs: Any) -> Any:
        """Records one execution's ``outputs`` (any pytree of jax.Arrays) and returns them unchanged."""
        if self.active:
            leaf = _first_array(outputs)
            if leaf is not None:
                while self._queued and _done(self._queued[0]):
                    self._queued.popleft()  # finished: nothing to wait for, and its memory goes with the caller's
                self._queued.append(_one_buffer(leaf))
                while len(self._queued) > self.bound:
                    self._queued.popleft().block_until_ready()
        return outputs


def _one_buffer(array: Any) -> Any:
    """The first device's buffer of ``array``, what the bound waits on.

    Holding the whole result would keep every device's copy of it alive for ``bound`` more
    calls after its caller dropped it (GPT-2's replicated logits at 8 devices: 8 x 25 MB a call,
    1.6 GB held at the bound). One device's part of an execution that has collectives cannot
    finish before the other devices reach them, so its buffer bounds the queue as well.
    """
    return array.addressable_data(0) if hasattr(array, "addressable_data") else array


def _done(buffer: Any) -> bool:
    """Whether the execution behind ``buffer`` has finished (without waiting for it).

    A caller that read its result (``np.asarray``) has waited already: holding that buffer for
    ``bound`` more calls would only keep its memory (GPT-2's pipeline 2 x 4: 6.4 MB of logits a call).
    """
    is_ready = getattr(buffer, "is_ready", None)
    return bool(is_ready()) if is_ready is not None else False


def _first_array(outputs: Any) -> Any:
    """One array of an execution's outputs: all of them are ready together."""
    if hasattr(outputs, "block_until_ready"):
        return outputs
    if isinstance(outputs, (tuple, list)):
        for item in outputs:
            found = _first_array(item)
            if found is not None:
                return found
    if isinstance(outputs, dict):
        for item in outputs.values():
            found = _first_array(item)
            if found is not None:
                return found
    return None
