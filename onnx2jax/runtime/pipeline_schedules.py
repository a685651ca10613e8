"""Training schedules of a pipeline as data: per rank, a list of actions, checked before anything runs.

A pipeline that trains runs, per (stage, micro-batch), a forward ``F`` and a
backward ``B`` (or ``B`` split into the input gradient ``I`` and the weight
gradient ``W``, as ZeroBubble does), and moves activations and their
gradients between ranks with ``SEND_F``/``RECV_F`` and ``SEND_B``/``RECV_B``
(torch.distributed.pipelining's vocabulary). A rank is a device group; a
rank holds one stage, or several (virtual stages, interleaved 1F1B: stage
``s`` on rank ``s % R``).

A :class:`PipelineSchedule` is one such list per rank. :func:`issue_order`
checks it and gives the order a single controller issues the actions in
(each rank's actions in its own order, a rank waiting where an action needs
what another rank has not done yet); a schedule that can never finish (an
action before what it needs, on its own rank or another's), that misses or
repeats an action, puts a stage on another rank, or holds more micro-batches
than its memory bound is refused with :class:`~onnx2jax.errors.ScheduleError`
naming the action. :func:`simulate` times it with unit costs (bubble fraction,
micro-batches held per rank), which is what ``bench/bench_pipeline_train.py``
compares with each schedule's analytic bound.

The builders (:func:`build`) make GPipe (all forwards, then all backwards),
1F1B, interleaved 1F1B (Megatron's order over virtual stages) and ZB-H1
(1F1B with each weight gradient deferred into the bubbles) by one greedy list
scheduler over unit costs (F = I = W = 1, B = 2).
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from typing import Iterator, Mapping, Sequence

from onnx2jax.errors import ScheduleError

COMPUTE = ("F", "B", "I", "W")
COMMUNICATION = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")

#: Unit costs of the builders and of :func:`simulate` (a backward is twice a forward).
UNIT_COSTS: Mapping[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


@dataclasses.dataclass(frozen=True, order=True)
class Action:
    """One step of a schedule: ``kind`` (F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B) of ``stage`` on ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}(stage {self.stage}, micro-batch {self.microbatch})"


@dataclasses.dataclass(frozen=True)
class PipelineSchedule:
    """A training schedule: per rank, its actions in order.

    Attributes:
      name: what error messages call it.
      stages: how many pipeline stages (virtual stages included).
      microbatches: how many micro-batches one step runs.
      stage_rank: the rank (device group) of each stage.
      ranks: per rank, its actions in issue order.
      memory_bound: per rank, the most micro-batches whose residuals it may
        hold at once (a forward done, its backward or weight gradient not);
        None: no bound beyond the number of micro-batches.
    """

    name: str
    stages: int
    microbatches: int
    stage_rank: tuple[int, ...]
    ranks: tuple[tuple[Action, ...], ...]
    memory_bound: tuple[int, ...] | None = None

    @property
    def split_backward(self) -> bool:
        """Whether the backward runs as I and W (ZeroBubble), not B."""
        return any(a.kind in ("I", "W") for rank in self.ranks for a in rank)

    def steps(self, stages: int, microbatches: int) -> Iterator[tuple[int, int]]:
        """Its forwards as (stage, micro-batch), in issue order: a forward-only call runs these."""
        if (stages, microbatches) != (self.stages, self.microbatches):
            raise ScheduleError(
                f"schedule {self.name!r} is for {self.stages} stages x {self.microbatches} micro-batches, "
                f"not {stages} x {microbatches}"
            )
        return ((a.stage, a.microbatch) for a in issue_order(self) if a.kind == "F")


# ---------------------------------------------------------------------------
# Dependencies and the check
# ---------------------------------------------------------------------------


def _needs(action: Action, schedule: PipelineSchedule, present: set[Action]) -> list[Action]:
    """What ``action`` needs done before it. Communication is needed only where the schedule has it."""
    kind, s, m = action.kind, action.stage, action.microbatch
    last = schedule.stages - 1
    backward = "I" if schedule.split_backward else "B"
    if kind == "F":
        if s == 0:
            return []
        receive = Action("RECV_F", s, m)
        return [receive] if receive in present else [Action("F", s - 1, m)]
    if kind in ("B", "I"):
        needs = [Action("F", s, m)]
        if s < last:
            receive = Action("RECV_B", s, m)
            needs.append(receive if receive in present else Action(backward, s + 1, m))
        return needs
    if kind == "W":
        return [Action("I", s, m)]
    if kind == "SEND_F":
        return [Action("F", s, m)]
    if kind == "RECV_F":
        return [Action("SEND_F", s - 1, m)]
    if kind == "SEND_B":
        return [Action(backward, s, m)]
    return [Action("SEND_B", s + 1, m)]  # RECV_B


def _check_actions(schedule: PipelineSchedule) -> None:
    """Every action known, in range, on its stage's rank, once; every compute action there."""
    name, stages, micro = schedule.name, schedule.stages, schedule.microbatches
    if len(schedule.stage_rank) != stages:
        raise ScheduleError(f"schedule {name!r}: stage_rank names {len(schedule.stage_rank)} stages, not {stages}")
    seen: set[Action] = set()
    for rank, actions in enumerate(schedule.ranks):
        for action in actions:
            if action.kind not in COMPUTE + COMMUNICATION:
                raise ScheduleError(f"schedule {name!r}: unknown action kind {action.kind!r} in {action}")
            if not (0 <= action.stage < stages and 0 <= action.microbatch < micro):
                raise ScheduleError(f"schedule {name!r}: {action} is out of range ({stages} stages x {micro} micro-batches)")
            if schedule.stage_rank[action.stage] != rank:
                raise ScheduleError(
                    f"schedule {name!r}: {action} is on rank {rank}, but stage {action.stage} runs on rank "
                    f"{schedule.stage_rank[action.stage]}"
                )
            if action in seen:
                raise ScheduleError(f"schedule {name!r}: {action} is repeated")
            seen.add(action)
    split = schedule.split_backward
    if split and any(a.kind == "B" for a in seen):
        raise ScheduleError(f"schedule {name!r} mixes B with I and W: a backward is either B or I then W")
    kinds = ("F", "I", "W") if split else ("F", "B")
    for s in range(stages):
        for m in range(micro):
            for kind in kinds:
                if Action(kind, s, m) not in seen:
                    raise ScheduleError(f"schedule {name!r} never runs {Action(kind, s, m)}")
    for action in seen:  # a send without its receive, or a receive without its send
        pair = {"SEND_F": ("RECV_F", 1), "RECV_F": ("SEND_F", -1), "SEND_B": ("RECV_B", -1), "RECV_B": ("SEND_B", 1)}
        if action.kind in pair:
            other, step = pair[action.kind]
            match = Action(other, action.stage + step, action.microbatch)
            if match not in seen:
                raise ScheduleError(f"schedule {name!r}: {action} has no matching {match}")


def _check_memory(schedule: PipelineSchedule) -> None:
    """Each rank's peak of micro-batches held (forward done, backward or W not) within its bound."""
    if schedule.memory_bound is None:
        return
    release = "W" if schedule.split_backward else "B"
    for rank, actions in enumerate(schedule.ranks):
        held: set[tuple[int, int]] = set()
        for action in actions:
            if action.kind == "F":
                held.add((action.stage, action.microbatch))
                if len(held) > schedule.memory_bound[rank]:
                    raise ScheduleError(
                        f"schedule {schedule.name!r}: at {action} rank {rank} holds {len(held)} micro-batches' "
                        f"residuals, over its memory bound of {schedule.memory_bound[rank]}"
                    )
            elif action.kind == release:
                held.discard((action.stage, action.microbatch))


def issue_order(schedule: PipelineSchedule) -> list[Action]:
    """Checks ``schedule`` and returns its actions in the order a single controller issues them.

    Round-robin over the ranks: each issues its next action once what it
    needs is issued. A round where no rank can go on is a deadlock, reported
    with what each rank waits for.

    Raises:
      ScheduleError: see the module docstring.
    """
    _check_actions(schedule)
    _check_memory(schedule)
    present = {a for rank in schedule.ranks for a in rank}
    for rank, actions in enumerate(schedule.ranks):  # what a rank needs of its own work comes earlier in its list
        position = {a: i for i, a in enumerate(actions)}
        for i, action in enumerate(actions):
            for need in _needs(action, schedule, present):
                if position.get(need, -1) > i:
                    raise ScheduleError(f"schedule {schedule.name!r}: rank {rank} runs {action} before {need}")
    done: set[Action] = set()
    cursor = [0] * len(schedule.ranks)
    order: list[Action] = []
    while len(order) < len(present):
        progressed = False
        for rank, actions in enumerate(schedule.ranks):
            if cursor[rank] < len(actions):
                action = actions[cursor[rank]]
                if all(need in done for need in _needs(action, schedule, present)):
                    done.add(action)
                    order.append(action)
                    cursor[rank] += 1
                    progressed = True
        if not progressed:
            waits = []
            for rank, actions in enumerate(schedule.ranks):
                if cursor[rank] < len(actions):
                    action = actions[cursor[rank]]
                    missing = [str(n) for n in _needs(action, schedule, present) if n not in done]
                    waits.append(f"rank {rank} runs {action} before {', '.join(missing)}")
            raise ScheduleError(f"schedule {schedule.name!r} cannot finish: {'; '.join(waits)}")
    return order


# ---------------------------------------------------------------------------
# Building schedules
# ---------------------------------------------------------------------------


def with_communication(schedule: PipelineSchedule) -> PipelineSchedule:
    """The schedule with SEND/RECV added where consecutive stages are on different ranks (none given).

    A send follows its compute action on the sender's rank; the receive goes
    just before the action that needs it on the receiver's rank.
    """
    if any(a.kind in COMMUNICATION for rank in schedule.ranks for a in rank):
        return schedule
    backward = "I" if schedule.split_backward else "B"
    rank_of = schedule.stage_rank
    ranks = []
    for actions in schedule.ranks:
        out: list[Action] = []
        for action in actions:
            s, m = action.stage, action.microbatch
            if action.kind == "F" and s > 0 and rank_of[s - 1] != rank_of[s]:
                out.append(Action("RECV_F", s, m))
            if action.kind == backward and s < schedule.stages - 1 and rank_of[s + 1] != rank_of[s]:
                out.append(Action("RECV_B", s, m))
            out.append(action)
            if action.kind == "F" and s < schedule.stages - 1 and rank_of[s + 1] != rank_of[s]:
                out.append(Action("SEND_F", s, m))
            if action.kind == backward and s > 0 and rank_of[s - 1] != rank_of[s]:
                out.append(Action("SEND_B", s, m))
        ranks.append(tuple(out))
    return dataclasses.replace(schedule, ranks=tuple(ranks))


def _greedy(
    name: str,
    stages: int,
    microbatches: int,
    stage_rank: Sequence[int],
    forward_order: Sequence[Sequence[tuple[int, int]]],
    backward_order: Sequence[Sequence[tuple[int, int]]],
    limit: Sequence[int],
    policy: str,
) -> PipelineSchedule:
    """List-schedules each rank's forwards and backwards in their given orders, at unit costs.

    ``policy``: ``"fill-drain"`` (every forward of a rank before its first
    backward), ``"1f1b"`` (a ready backward first, else a forward while fewer
    than ``limit`` micro-batches are held) or ``"zb"`` (as 1F1B with the
    backward split: a ready I first, else a forward under the limit, else a
    deferred W, which frees its micro-batch).
    """
    ranks = len(forward_order)
    split = policy == "zb"
    back_kind = "I" if split else "B"
    finish: dict[tuple[str, int, int], float] = {}
    fi, bi = [0] * ranks, [0] * ranks
    deferred: list[list[tuple[int, int]]] = [[] for _ in range(ranks)]
    held = [0] * ranks
    last = [""] * ranks
    free = [0.0] * ranks
    out: list[list[Action]] = [[] for _ in range(ranks)]
    events: list[float] = [0.0]
    total = sum(len(f) for f in forward_order) * (3 if split else 2)
    issued = 0

    def ready(key: tuple[str, int, int], now: float) -> bool:
        return key in finish and finish[key] <= now

    while issued < total:
        now = heapq.heappop(events)
        for r in range(ranks):
            if free[r] > now:
                continue
            backward = forward = None
            if bi[r] < len(backward_order[r]) and (policy != "fill-drain" or fi[r] == len(forward_order[r])):
                s, m = backward_order[r][bi[r]]
                if ready(("F", s, m), now) and (s == stages - 1 or ready((back_kind, s + 1, m), now)):
                    backward = (back_kind, s, m)
            if fi[r] < len(forward_order[r]) and held[r] < limit[r]:
                s, m = forward_order[r][fi[r]]
                if s == 0 or ready(("F", s - 1, m), now):
                    forward = ("F", s, m)
            # a ready backward first, except right after one: then a ready forward (1F1B's alternation)
            choice = forward if forward is not None and last[r] == back_kind else backward or forward
            if choice is None and split and deferred[r]:
                choice = ("W", *deferred[r].pop(0))
            if choice is None:
                continue
            kind, s, m = choice
            if kind != "W":
                last[r] = kind
            if kind == "F":
                fi[r] += 1
                held[r] += 1
            elif kind == back_kind:
                bi[r] += 1
                if split:
                    deferred[r].append((s, m))
                else:
                    held[r] -= 1
            else:
                held[r] -= 1
            free[r] = finish[choice] = now + UNIT_COSTS[kind]
            heapq.heappush(events, free[r])
            out[r].append(Action(kind, s, m))
            issued += 1
        if not events:
            raise ScheduleError(f"schedule {name!r}: the builder found no order (a memory limit too small)")
    return PipelineSchedule(name, stages, microbatches, tuple(stage_rank), tuple(tuple(a) for a in out), tuple(limit))


def build(name: str, stage_rank: Sequence[int], microbatches: int) -> PipelineSchedule:
    """The named schedule (:data:`NAMES`) for stages on ``stage_rank``'s ranks, with communication.

    Stages must sit on ranks 0..R-1 in turn (stage ``s`` on rank ``s % R``):
    one stage per rank, or V virtual stages per rank for interleaved 1F1B.

    Raises:
      ScheduleError: an unknown name, stages not on ranks in turn, a
        schedule other than interleaved 1F1B over virtual stages, or
        interleaved 1F1B with micro-batches not a multiple of the ranks.
    """
    stages, m_count = len(stage_rank), microbatches
    ranks = max(stage_rank) + 1
    if name not in NAMES:
        raise ScheduleError(f"unknown schedule {name!r}: one of {', '.join(NAMES)}, or a PipelineSchedule")
    if list(stage_rank) != [s % ranks for s in range(stages)]:
        raise ScheduleError(f"schedule {name!r}: stages must sit on ranks in turn (stage s on rank s % {ranks}), got {list(stage_rank)}")
    virtual = stages // ranks
    if virtual > 1 and name != "interleaved-1f1b":
        raise ScheduleError(
            f"schedule {name!r} runs one stage per rank, but {stages} stages share {ranks} device groups: "
            "use 'interleaved-1f1b'"
        )
    own = [[s for s in range(stages) if stage_rank[s] == r] for r in range(ranks)]
    if name == "interleaved-1f1b" and virtual > 1:
        if m_count % ranks:
            raise ScheduleError(
                f"schedule 'interleaved-1f1b': micro-batches ({m_count}) must be a multiple of the ranks ({ranks})"
            )
        groups = [range(g * ranks, (g + 1) * ranks) for g in range(m_count // ranks)]
        forward = [[(s, m) for g in groups for s in own[r] for m in g] for r in range(ranks)]
        backward = [[(s, m) for g in groups for s in reversed(own[r]) for m in g] for r in range(ranks)]
        limit = [min(m_count * virtual, (ranks - r - 1) * 2 + (virtual - 1) * ranks + 1) for r in range(ranks)]
        built = _greedy(name, stages, m_count, stage_rank, forward, backward, limit, "1f1b")
    else:
        forward = [[(s, m) for m in range(m_count)] for s in range(stages)]
        if name == "gpipe":
            limit, policy = [m_count] * stages, "fill-drain"
        else:
            limit, policy = [min(m_count, stages - s) for s in range(stages)], "zb" if name == "zero-bubble" else "1f1b"
        built = _greedy(name, stages, m_count, stage_rank, forward, forward, limit, policy)
    return with_communication(built)


def custom(
    ranks: Sequence[Sequence[Action | str]],
    stage_rank: Sequence[int] | None = None,
    microbatches: int | None = None,
    memory_bound: Sequence[int] | int | None = None,
    name: str = "custom",
) -> PipelineSchedule:
    """A schedule from per-rank action lists (``Action`` or ``"F0.1"`` for F of stage 0, micro-batch 1).

    ``stage_rank`` defaults to one stage per rank; ``microbatches`` to the
    largest named plus one. Without SEND/RECV, they are added
    (:func:`with_communication`). Checked at once (:func:`issue_order`).

    Raises:
      ScheduleError: an action that cannot be read, or the check's.
    """
    parsed = [tuple(_parse(a) for a in actions) for actions in ranks]
    stage_rank = tuple(stage_rank) if stage_rank is not None else tuple(range(len(parsed)))
    if microbatches is None:
        microbatches = 1 + max((a.microbatch for actions in parsed for a in actions), default=0)
    if isinstance(memory_bound, int):
        memory_bound = (memory_bound,) * len(parsed)
    schedule = with_communication(
        PipelineSchedule(name, len(stage_rank), microbatches, stage_rank, tuple(parsed),
                         tuple(memory_bound) if memory_bound is not None else None)
    )
    issue_order(schedule)
    return schedule


def _parse(action: Action | str) -> Action:
    if isinstance(action, Action):
        return action
    match = re.fullmatch(r"([A-Z_]+)(\d+)\.(\d+)", action)
    if match is None:
        raise ScheduleError(f"cannot read action {action!r}: write KIND<stage>.<micro-batch>, e.g. 'F0.1'")
    return Action(match.group(1), int(match.group(2)), int(match.group(3)))


# ---------------------------------------------------------------------------
# Timing a schedule
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Simulation:
    """A schedule timed at given costs: makespan, per-rank busy time, bubble and micro-batches held at peak."""

    makespan: float
    busy: tuple[float, ...]
    peak_held: tuple[int, ...]

    @property
    def bubble(self) -> float:
        """Idle share of the ranks' time: ``1 - sum(busy) / (ranks * makespan)``."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def simulate(schedule: PipelineSchedule, costs: Mapping[str, float] = UNIT_COSTS) -> Simulation:
    """Times ``schedule`` with ``costs`` per compute action (communication free), each rank in its order."""
    order = issue_order(schedule)
    present = set(order)
    finish: dict[Action, float] = {}
    free = [0.0] * len(schedule.ranks)
    busy = [0.0] * len(schedule.ranks)
    for action in order:  # issue order respects every dependency, so each start is known
        rank = schedule.stage_rank[action.stage]
        start = max([free[rank]] + [finish[n] for n in _needs(action, schedule, present)])
        cost = costs.get(action.kind, 0.0)
        finish[action] = free[rank] = start + cost
        busy[rank] += cost
    release = "W" if schedule.split_backward else "B"
    peaks = []
    for actions in schedule.ranks:
        held = peak = 0
        for action in actions:
            held += (action.kind == "F") - (action.kind == release)
            peak = max(peak, held)
        peaks.append(peak)
    return Simulation(max(finish.values()), tuple(busy), tuple(peaks))


def analytic_bubble(name: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """The textbook bubble of each schedule at unit costs (F = 1, B = 2; I = W = 1).

    GPipe and 1F1B: ``(S-1)/(M+S-1)``; interleaved 1F1B over V virtual stages
    per rank (S ranks): ``(S-1)/(V*M+S-1)``; ZB-H1: ``(S-1)/(3M+S-1)`` (the
    bubble shrinks to one forward-and-backward-minus-W per stage, of 3 units).
    """
    if name == "zero-bubble":
        return (stages - 1) / (3 * microbatches + stages - 1)
    return (stages - 1) / (virtual * microbatches + stages - 1)


__all__ = [
    "Action", "NAMES", "PipelineSchedule", "Simulation", "analytic_bubble", "build", "custom", "issue_order",
    "simulate", "with_communication",
]
