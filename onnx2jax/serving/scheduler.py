"""The scheduler: which requests prefill (a chunk each a step), which decode, which wait or are preempted.

It owns no arrays: slots, pages and block tables are numbers. Each :meth:`Scheduler.schedule` gives one step's
work: one chunk of each of at most ``prefill_rows`` prefilling requests, run as one call (so a newcomer delays
the others' decoding by one prefill call at most), and every request that is decoding. Pages are given as a request grows: a request admitted gets the pages its known
tokens need; a decoding request gets one more page when its next token (its next ``ahead`` tokens, where the
engine runs several decode steps in one call) starts one. When none is free, the
request admitted last among those running is preempted (its pages and slot freed, itself back at the head of
the queue, to be prefilled again from its prompt and the tokens it generated: recomputation, as vLLM does), so
no request ever reads or writes another's pages.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq


class State(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclasses.dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it.

    Attributes:
      id: the request's id.
      tokens: prompt and generated tokens (the last generated one is not in the cache yet while decoding).
      cached: positions of ``tokens`` written into the cache.
      slot: its row of the decode batch (None: none held).
      block: its pages in order.
      order: admission counter (the latest admitted is preempted first).
      preemptions: how many times it was preempted.
      ahead: the decode steps the next step runs for it (the engine sets it; its pages must hold them).
    """

    id: int
    tokens: list[int]
    state: State = State.WAITING
    cached: int = 0
    slot: int | None = None
    block: list[int] = dataclasses.field(default_factory=list)
    order: int = -1
    preemptions: int = 0
    ahead: int = 1


@dataclasses.dataclass
class Plan:
    """One step's work: the prefill chunks (sequence, first position, count), the decoding sequences, and
    those preempted while planning it."""

    prefill: list[tuple[Sequence, int, int]]
    decode: list[Sequence]
    preempted: list[Sequence]


class Scheduler:
    """Slots, pages and the queue (module docstring)."""

    def __init__(self, *, slots: int, num_pages: int, page_size: int, chunk: int, prefill_rows: int = 1):
        self.page_size, self.chunk, self.num_pages, self.prefill_rows = page_size, chunk, num_pages, prefill_rows
        self.free_slots = list(range(slots))  # a heap: the lowest free slot is taken first, so that the rows in
        # use stay low and a decode step runs only as many rows as the highest slot in use needs
        self.free_pages = list(range(num_pages))[::-1]
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self._admitted = 0

    def pages_for(self, positions: int) -> int:
        """Pages that hold ``positions`` positions."""
        return -(-positions // self.page_size)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Ends ``seq`` wherever it is, freeing its slot and pages."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        seq.state = State.DONE

    def _release(self, seq: Sequence) -> None:
        self.free_pages.extend(reversed(seq.block))
        seq.block = []
        if seq.slot is not None:
            heapq.heappush(self.free_slots, seq.slot)
            seq.slot = None
        seq.cached = 0

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.state = State.WAITING
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> Plan:
        """The next step's work (module docstring)."""
        preempted: list[Sequence] = []
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            need = self.pages_for(len(seq.tokens))
            if need > len(self.free_pages):
                break
            self.waiting.popleft()
            seq.slot = heapq.heappop(self.free_slots)
            seq.block = [self.free_pages.pop() for _ in range(need)]
            seq.state, seq.cached, seq.order = State.PREFILL, 0, self._admitted
            self._admitted += 1
            self.running.append(seq)
        for seq in sorted((s for s in self.running if s.state is State.DECODE), key=lambda s: s.order):
            if seq not in self.running:  # preempted by an earlier one of this loop
                continue
            while len(seq.block) < self.pages_for(seq.cached + seq.ahead):
                if self.free_pages:
                    seq.block.append(self.free_pages.pop())
                    continue
                victim = max(self.running, key=lambda s: s.order)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        prefilling = [s for s in self.running if s.state is State.PREFILL][: self.prefill_rows]
        chunks = [(s, s.cached, min(self.chunk, len(s.tokens) - s.cached)) for s in prefilling]
        decode = [s for s in self.running if s.state is State.DECODE]
        return Plan(chunks, decode, preempted)

    def check(self) -> None:
        """Asserts that no page is held twice or both held and free, and that no slot is either (for tests)."""
        held = [p for s in self.running for p in s.block]
        assert len(held) == len(set(held)), f"a page is held twice: {sorted(held)}"
        assert not set(held) & set(self.free_pages), "a page is both held and free"
        assert len(held) + len(self.free_pages) == self.num_pages, "pages were lost"
        slots = [s.slot for s in self.running]
        assert len(slots) == len(set(slots)) and not set(slots) & set(self.free_slots), "a slot is held twice"
