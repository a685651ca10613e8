"""The engine driver never holds the server's event loop for a step: adds and aborts return at once.

A stand-in engine whose step takes a second (the driver's contract with the engine is a handful of calls): while
it steps, the event loop adds a request, aborts another and reads the figures, each well within the step.
Before the inbox, an add took the step's lock and waited for the step to end, holding every stream's writes.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import types

import pytest

from onnx2jax.errors import RequestError
from onnx2jax.serving.driver import EngineDriver
from onnx2jax.serving.params import SamplingParams

STEP_SECONDS = 1.0


class SlowEngine:
    """Each step takes STEP_SECONDS and gives every running request one token; a request ends after two."""

    def __init__(self):
        self.scheduler = types.SimpleNamespace(waiting=[])
        self.running: dict[int, list[int]] = {}
        self.finished: dict[int, str] = {}
        self.stepping = threading.Event()
        self._ids = itertools.count()
        self.max_batch = 4
        self.counts = {"waiting": 0, "running": 0, "slots_used": 0, "pages_used": 0, "pages": 8}

    def check_request(self, prompt, params):
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise RequestError("prompt", "is empty")
        return prompt

    def add_request(self, prompt, params):
        rid = next(self._ids)
        self.running[rid] = []
        return rid

    def has_work(self):
        return any(rid not in self.finished for rid in self.running)

    def step(self):
        self.stepping.set()
        time.sleep(STEP_SECONDS)
        out = {}
        for rid, tokens in self.running.items():
            if rid not in self.finished:
                tokens.append(7)
                out[rid] = [7]
                if len(tokens) == 2:
                    self.finished[rid] = "length"
        return out

    def finish_reason(self, rid):
        return self.finished.get(rid)

    def generated(self, rid):
        return len(self.running[rid])

    def release(self, rid):
        self.finished.setdefault(rid, "abort")


def test_adding_and_aborting_during_a_step_do_not_wait_for_it():
    engine = SlowEngine()
    driver = EngineDriver(engine, queue_bound=8)
    driver.start()

    async def scenario():
        first, first_queue = driver.add([1, 2], SamplingParams(max_tokens=2))
        assert await asyncio.to_thread(engine.stepping.wait, 5)  # the engine is inside a one-second step
        start = time.perf_counter()
        second, second_queue = driver.add([3], SamplingParams(max_tokens=2))
        driver.abort(second)
        driver.metrics()
        waited = time.perf_counter() - start
        assert waited < STEP_SECONDS / 4, f"the event loop waited {waited:.3f} s for the engine's step"
        with pytest.raises(RequestError):
            driver.add([], SamplingParams(max_tokens=2))  # refused where it is added, by name
        events = [await asyncio.wait_for(first_queue.get(), 10) for _ in range(2)]
        aborted = await asyncio.wait_for(second_queue.get(), 10)
        return events, aborted

    try:
        events, aborted = asyncio.run(scenario())
    finally:
        driver.stop(timeout=0)
    assert [e.tokens for e in events] == [[7], [7]] and events[-1].finish_reason == "length"
    assert aborted.finish_reason == "abort" and aborted.tokens == []
    assert driver.figures["requests_received"] == 2 and driver.figures["requests_aborted"] == 1
    # /metrics' time to first token counts from the request's arrival (its first token came after a whole step)
    assert list(driver.ttft) and driver.ttft[0] >= 0.9 * STEP_SECONDS
