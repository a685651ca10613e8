"""The engine on its own thread, for an asyncio server: :class:`EngineDriver`.

One thread steps the :class:`~onnx2jax.serving.engine.Engine` while it has work and sleeps while it has none;
each step's tokens go to the request's ``asyncio.Queue`` as they are made. The event loop never waits for a
step: a request is checked where it is added (:meth:`Engine.check_request`, so a refusal is immediate), then
waits in an inbox with the aborts, which the engine's thread takes before its next step. (An add that took the
step's lock held the event loop for up to a step, 10-30 ms at a real model's 16 rows, during which no stream
was written and no request read.) The driver also keeps the figures ``/metrics`` shows.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import threading
import time
from typing import Any, Sequence

from onnx2jax.serving.engine import Engine
from onnx2jax.serving.params import SamplingParams


@dataclasses.dataclass
class Event:
    """What a request's queue receives: new tokens, and the finish reason with its last event."""

    tokens: list[int]
    finish_reason: str | None = None


@dataclasses.dataclass
class _Request:
    """A request the driver holds: what the engine needs to start it, and where its events go."""

    ticket: int  # what add returns and abort takes (the engine's own id exists once it is admitted)
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrived: float  # time.perf_counter() at add

    def tell(self, event: Event) -> None:
        """``event`` to the request's queue, on its event loop."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class QueueFull(Exception):
    """More requests wait than the queue bound allows."""


class EngineDriver:
    """Steps ``engine`` on a thread (module docstring).

    Args:
      engine: the engine; nothing else may step it while the driver runs.
      queue_bound: the most requests waiting for a slot; beyond it :meth:`add` raises :class:`QueueFull`.
    """

    def __init__(self, engine: Engine, *, queue_bound: int = 64):
        self.engine, self.queue_bound = engine, queue_bound
        self._lock = threading.Lock()  # the engine's: held by a step
        self._wake = threading.Event()
        self._inbox_lock = threading.Lock()  # the inbox's: held for a list append or swap
        self._inbox: list[_Request] = []
        self._aborts: list[int] = []  # tickets to abort at the next step
        self._tickets = itertools.count()
        self._rids: dict[int, int] = {}  # ticket -> the engine's request id, while it runs
        self._running: dict[int, _Request] = {}  # by the engine's id, from admission to its last event
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="onnx2jax-engine", daemon=True)
        self.started = time.time()
        self.figures = collections.Counter()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens) of steps
        self.ttft: collections.deque[float] = collections.deque(maxlen=4096)  # seconds, latest requests
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout: float = 30.0) -> None:
        """Lets the requests in flight finish for up to ``timeout`` seconds, aborts the rest, ends the thread."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self._has_work() and self._thread.is_alive():
            time.sleep(0.02)
        with self._lock:
            with self._inbox_lock:
                self._stop = True
                inbox, self._inbox, self._aborts = self._inbox, [], []
            for request in inbox:
                request.tell(Event([], "abort"))
            for rid in list(self._running):
                self._abort_locked(rid)
        self._wake.set()
        self._thread.join(timeout=10)

    def add(self, prompt: Sequence[int], params: SamplingParams) -> tuple[int, asyncio.Queue]:
        """Queues a request (checked: :class:`~onnx2jax.errors.RequestError`) without waiting for a step;
        returns its ticket (what :meth:`abort` takes) and the queue its :class:`Event` s arrive on.

        Raises:
          QueueFull: ``queue_bound`` requests wait already.
          RuntimeError: the driver has stopped.
        """
        checked = self.engine.check_request(prompt, params)
        queue: asyncio.Queue = asyncio.Queue()
        with self._inbox_lock:
            if self._stop or self.error is not None:
                raise RuntimeError("the engine has stopped")
            if len(self.engine.scheduler.waiting) + len(self._inbox) >= self.queue_bound:
                self.figures["requests_rejected"] += 1
                raise QueueFull(f"{self.queue_bound} requests are waiting already")
            ticket = next(self._tickets)
            request = _Request(ticket, checked, params, asyncio.get_running_loop(), queue, time.perf_counter())
            self._inbox.append(request)
            self.figures["requests_received"] += 1
        self._wake.set()
        return ticket, queue

    def abort(self, ticket: int) -> None:
        """Ends a request (a client gone): its slot and pages are free from the next step."""
        with self._inbox_lock:
            self._aborts.append(ticket)
        self._wake.set()

    def _admit(self) -> None:
        """Under the engine's lock: the inbox's requests into the engine, then the aborts asked for."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = set(self._aborts), []
        for request in inbox:
            if request.ticket in aborts:  # gone before it started
                aborts.discard(request.ticket)
                self.figures["requests_aborted"] += 1
                request.tell(Event([], "abort"))
                continue
            rid = self.engine.add_request(request.prompt, request.params)
            self._running[rid] = request
            self._rids[request.ticket] = rid
        for ticket in aborts:
            rid = self._rids.get(ticket)
            if rid is not None:
                self._abort_locked(rid)

    def _abort_locked(self, rid: int) -> None:
        if rid in self._running:
            self.engine.release(rid)
            request = self._running.pop(rid)
            self._rids.pop(request.ticket, None)
            self.figures["requests_aborted"] += 1
            request.tell(Event([], "abort"))

    def _has_work(self) -> bool:
        """Whether a request runs, waits in the engine or waits in the inbox, or an abort is asked for."""
        return bool(self.engine.has_work() or self._inbox or self._aborts)

    def _loop(self) -> None:
        try:
            while not self._stop:
                if not self._has_work():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                with self._lock:
                    self._admit()
                    if not self.engine.has_work():
                        continue
                    out = self.engine.step()
                    self._deliver(out)
        except BaseException as error:  # noqa: BLE001 -- every waiting client is told, then /health says so
            self.error = error
            with self._lock:
                with self._inbox_lock:
                    waiting, self._inbox = self._inbox, []
                for request in waiting + list(self._running.values()):
                    request.tell(Event([], "error"))
                self._running.clear()
            raise

    def _deliver(self, out: dict[int, list[int]]) -> None:
        """Each request's new tokens (and finish reason) to its queue: one hand-off to each event loop a step,
        not one a request (each wakes the loop)."""
        now = time.time()
        made = sum(len(t) for t in out.values())
        self.figures["tokens_generated"] += made
        self._recent.append((now, made))
        while self._recent and self._recent[0][0] < now - 10:
            self._recent.popleft()
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Event]]] = {}
        for rid in list(self._running):
            tokens = out.get(rid, [])
            reason = self.engine.finish_reason(rid)
            if not tokens and reason is None:
                continue
            request = self._running[rid]
            if tokens and self.engine.generated(rid) == len(tokens):  # its first tokens, from its arrival here
                self.ttft.append(time.perf_counter() - request.arrived)
            batches.setdefault(request.loop, []).append((request.queue, Event(tokens, reason)))
            if reason is not None:
                self.figures[f"requests_finished_{reason}"] += 1
                self.engine.release(rid)
                del self._running[rid]
                self._rids.pop(request.ticket, None)
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def tokens_per_second(self) -> float:
        """Tokens made over the last 10 seconds, per second."""
        if not self._recent:
            return 0.0
        span = max(time.time() - self._recent[0][0], 1e-3)
        return sum(n for _, n in self._recent) / max(span, 1.0)

    def metrics(self) -> str:
        """The figures in Prometheus' text format."""
        counts = self.engine.counts
        gauges = {
            "onnx2jax_requests_waiting": ("requests waiting for a slot", counts["waiting"]),
            "onnx2jax_requests_running": ("requests holding a slot", counts["running"]),
            "onnx2jax_slots_used": ("decode slots in use", counts["slots_used"]),
            "onnx2jax_slots_total": ("decode slots", self.engine.max_batch),
            "onnx2jax_cache_pages_used": ("KV cache pages in use", counts["pages_used"]),
            "onnx2jax_cache_pages_total": ("KV cache pages", counts["pages"]),
            "onnx2jax_tokens_per_second": ("tokens generated per second over the last 10 s", self.tokens_per_second()),
        }
        lines: list[str] = []
        for name, (text, value) in gauges.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value}"]
        lines += ["# HELP onnx2jax_requests_total requests by outcome", "# TYPE onnx2jax_requests_total counter"]
        for key in ("received", "rejected", "aborted", "finished_stop", "finished_length"):
            lines.append(f'onnx2jax_requests_total{{outcome="{key}"}} {self.figures[f"requests_{key}"]}')
        lines += ["# HELP onnx2jax_generated_tokens_total tokens generated", "# TYPE onnx2jax_generated_tokens_total counter",
                  f"onnx2jax_generated_tokens_total {self.figures['tokens_generated']}"]
        ttft = list(self.ttft)
        lines += ["# HELP onnx2jax_time_to_first_token_seconds from a request's arrival to its first token",
                  "# TYPE onnx2jax_time_to_first_token_seconds summary"]
        for q in (0.5, 0.99):
            value = sorted(ttft)[min(int(q * len(ttft)), len(ttft) - 1)] if ttft else float("nan")
            lines.append(f'onnx2jax_time_to_first_token_seconds{{quantile="{q}"}} {value}')
        lines += [f"onnx2jax_time_to_first_token_seconds_sum {sum(ttft)}",
                  f"onnx2jax_time_to_first_token_seconds_count {len(ttft)}"]
        return "\n".join(lines) + "\n"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None


def _put_all(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


def describe(driver: EngineDriver) -> dict[str, Any]:
    """The driver's state for /health."""
    return {"status": "ok" if driver.alive else "error", **driver.engine.counts}
