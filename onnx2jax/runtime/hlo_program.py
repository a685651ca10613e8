"""Compiled HLO text read as computations of instructions: shapes in bytes, and how often each runs.

A TPU executable's text (``Compiled.as_text()``) is what the TPU report counts from: the bytes a
collective moves come from its operands' and result's shapes, and a ``while`` loop's body runs once
per trip, which the compiler's own cost analysis counts once. :class:`HloProgram` holds each
instruction's name, shape, opcode, operands and attribute text, and :meth:`HloProgram.runs` says how
many times each computation runs per call of the program, from its callers and the loops' trip counts.

A trip count is known where the ``while`` carries ``known_trip_count`` (the CPU compiler writes it)
or where its condition is ``counter < N`` against a constant ``N`` (how jax lowers ``lax.scan`` and
``fori_loop`` with static bounds on the TPU, the counter starting at 0 and stepping by 1; an int64 counter
compared as two 32-bit halves included). Any other
loop's trip count is unknown (None) and its body counted once.
Each branch of a ``conditional`` counts as run whenever the conditional is: what a call runs at most.
"""

from __future__ import annotations

import dataclasses
import functools
import re

_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([^\s=]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b(pred|token|[subfc]\d+|bf16|f8e\w+)\[([\d,]*)\]")
_CALLED = re.compile(r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%([^,\s}]+)")
_BRANCHES = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP = re.compile(r'known_trip_count":\{"n":"(\d+)"')
_BITS = {"pred": 8, "token": 0, "bf16": 16}


def array_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape (a tuple's elements summed; tokens hold none).

    ``"(f32[4,8,128]{2,1,0:T(8,128)}, u32[], token[])"`` is 4*8*128*4 + 4 = 16388 bytes.
    """
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        bits = _BITS[dtype] if dtype in _BITS else 8 if dtype.startswith("f8") else int(dtype[1:])
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += (count * bits + 7) // 8
    return total


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction: ``%name = shape opcode(operands), attributes``."""

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    computation: str
    line: str = dataclasses.field(repr=False, compare=False, default="")

    @property
    def op_name(self) -> str:
        """The jax operation path of its ``metadata`` ('' where it has none)."""
        match = _OP_NAME.search(self.attributes)
        return match.group(1) if match else ""

    @property
    def called(self) -> tuple[str, ...]:
        """The computations it calls (a loop's body and condition, a fusion's, a reduction's)."""
        names = _CALLED.findall(self.attributes)
        for group in _BRANCHES.findall(self.attributes):
            names += re.findall(r"%([^,\s]+)", group)
        return tuple(names)


class HloProgram:
    """Compiled HLO text as computations and instructions (see the module docstring)."""

    def __init__(self, text: str):
        self.text = text
        self.computations: dict[str, list[Instruction]] = {}
        self.headers: dict[str, str] = {}
        self.entry = ""
        current = None
        for line in text.splitlines():
            match = _COMPUTATION.match(line)
            if match:
                current = match.group(2)
                self.computations[current] = []
                self.headers[current] = line
                if match.group(1):
                    self.entry = current
            elif line == "}":
                current = None
            elif current is not None:
                parsed = _INSTRUCTION.match(line)
                if parsed:
                    name, shape, opcode, rest = parsed.groups()
                    operands = re.findall(r"%([^\s,)]+)", rest.split(")", 1)[0])
                    self.computations[current].append(
                        Instruction(name, shape, opcode, tuple(operands), rest, current, line))
        self.instructions = {i.name: i for body in self.computations.values() for i in body}

    def operand_bytes(self, instruction: Instruction) -> int:
        """Bytes of an instruction's operands, from the shapes of the instructions that make them."""
        return sum(array_bytes(self.instructions[o].shape) for o in instruction.operands if o in self.instructions)

    def users(self, name: str) -> list[Instruction]:
        """The instructions that take ``name`` as an operand."""
        return self._users.get(name, [])

    @functools.cached_property
    def _users(self) -> dict[str, list[Instruction]]:
        users: dict[str, list[Instruction]] = {}
        for instruction in self.instructions.values():
            for operand in instruction.operands:
                users.setdefault(operand, []).append(instruction)
        return users

    def trip_count(self, loop: Instruction) -> int | None:
        """A ``while`` instruction's trip count, where the module docstring's rules know it."""
        known = _TRIP.search(loop.attributes)
        if known:
            return int(known.group(1))
        condition = re.search(r"condition=%([^,\s]+)", loop.attributes)
        body = self.computations.get(condition.group(1), []) if condition else []
        return self._bound(body[-1]) if body else None

    def _bound(self, root: Instruction) -> int | None:
        """N of a loop condition ``counter < N``: one compare, or with an int64 counter split in two u32
        halves on the TPU, ``hi < 0 or (hi == 0 and lo < N)``."""
        if root.opcode == "compare" and "direction=LT" in root.attributes and len(root.operands) == 2:
            return self._constant(root.operands[1])
        if root.opcode == "or":
            for part in (self.instructions.get(o) for o in root.operands):
                if part is None or part.opcode != "and":
                    continue
                compares = [self.instructions.get(o) for o in part.operands]
                if all(c is not None and c.opcode == "compare" and len(c.operands) == 2 for c in compares):
                    high = [c for c in compares if "direction=EQ" in c.attributes]
                    low = [c for c in compares if "direction=LT" in c.attributes]
                    if len(high) == 1 and len(low) == 1 and self._constant(high[0].operands[1]) == 0:
                        return self._constant(low[0].operands[1])
        return None

    def _constant(self, name: str) -> int | None:
        """The value of an integer scalar ``constant`` instruction (None for anything else)."""
        constant = self.instructions.get(name)
        if constant is None or constant.opcode != "constant":
            return None
        value = re.match(r"\s*(-?\d+)\)", constant.attributes)
        return int(value.group(1)) if value else None

    @functools.cached_property
    def runs(self) -> dict[str, int]:
        """Times each computation reachable from the entry runs per call (a loop body: its trip count)."""
        runs: dict[str, int] = {}

        def visit(name: str, times: int) -> None:
            runs[name] = runs.get(name, 0) + times
            for instruction in self.computations.get(name, []):
                trips = (self.trip_count(instruction) or 1) if instruction.opcode == "while" else 1
                for called in instruction.called:
                    visit(called, times * trips)

        visit(self.entry, 1)
        return runs

    def loops(self) -> list[tuple[Instruction, int | None]]:
        """Every ``while`` of the entry computation with its trip count (None where unknown)."""
        return [(i, self.trip_count(i)) for i in self.computations.get(self.entry, []) if i.opcode == "while"]

    def module_of(self, computation: str) -> str:
        """HLO module text whose entry is ``computation`` (with every other non-entry computation beside it),
        for a cost analysis of one loop body. Stack-frame references are dropped: the frames are not kept."""
        parts = []
        for name, header in self.headers.items():
            if name == self.entry:
                continue
            lines = [header.removeprefix("ENTRY ")] + [i.line for i in self.computations[name]]
            if name == computation:
                lines[0] = "ENTRY " + lines[0]
            parts.append("\n".join(lines) + "\n}")
        return re.sub(r",? ?stack_frame_id=\d+", "", "HloModule loop_body\n\n" + "\n\n".join(parts))

