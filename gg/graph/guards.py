"""Guard bytes: a debug mode that catches kernels writing outside their tensors.

`GG_DEBUG_GUARDS=1` (read when a plan is made, by its allocation pass) gives every arena block
GUARD_BYTES spare bytes before and after its tensor (offsets stay 256-aligned). The executor then
runs the plan one step at a time: before step i it fills the guards of the blocks that step i
takes with a fixed pattern, and after step i (synchronized) it reads back the guards of every
block alive during step i. A changed byte raises `gg.BackendError` naming the step (index, ops,
kernel, backend), the tensor and which guard (before / after) was hit.

Guards are (re)written when their block is taken rather than once per arena, because the
allocator reuses bytes: a block taken later may put its guards where an earlier, dead tensor's
data was. Backends know nothing of this: guards are written and read through the buffer
protocol (`write`, `read`), like any tensor data.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BackendError
from .allocate import Block
from .plan import Plan

if TYPE_CHECKING:
    from ..buffer import Buffer

GUARD_BYTES = 256
# A fixed permutation of the 256 byte values: no float a kernel is likely to write (0, 1.0, NaN,
# a repeated byte) matches it, and a shifted copy of one guard does not match another.
PATTERN = np.array([(i * 167 + 0x5B) & 0xFF for i in range(GUARD_BYTES)], dtype=np.uint8)


def enabled() -> bool:
    return os.environ.get("GG_DEBUG_GUARDS", "") in ("1", "true", "yes")


def guard_bytes() -> int:
    """The spare bytes the allocator leaves on each side of a block (0 when guards are off)."""
    return GUARD_BYTES if enabled() else 0


class Guards:
    """The guard regions of a bound plan: `arm(i)` before step i, `check(i)` after it."""

    def __init__(self, plan: Plan, arenas: dict[str, Buffer]):
        self.plan = plan
        self.arenas = arenas
        self.size = plan.alloc.guard
        n = len(plan.steps)
        self.born: list[list[Block]] = [[] for _ in range(n)]
        self.live: list[list[Block]] = [[] for _ in range(n)]
        for b in plan.alloc.blocks:
            self.born[b.first].append(b)
            for i in range(b.first, b.last + 1):
                self.live[i].append(b)

    def _regions(self, b: Block) -> tuple[tuple[str, int], tuple[str, int]]:
        return ("before", b.offset - self.size), ("after", b.offset + b.nbytes)

    def arm(self, i: int) -> None:
        """Fill the guards of the blocks step i takes (their bytes were free until now)."""
        for b in self.born[i]:
            buf = self.arenas[b.backend]
            for _, off in self._regions(b):
                buf.write(off, PATTERN)

    def check(self, i: int) -> None:
        """Raise BackendError if step i changed a guard of a block alive during it."""
        for b in self.live[i]:
            buf = self.arenas[b.backend]
            for which, off in self._regions(b):
                got = buf.read(off, self.size)
                if not np.array_equal(got, PATTERN):
                    raise BackendError(self._message(i, b, which, np.flatnonzero(got != PATTERN)))

    def _message(self, i: int, b: Block, which: str, bad: np.ndarray) -> str:
        step = self.plan.steps[i]
        t = b.tensor_at(i)
        lo, hi = int(bad[0]), int(bad[-1]) + 1
        if which == "before":
            lo, hi = lo - self.size, hi - self.size  # relative to the tensor's first byte
        ref = "end" if which == "after" else "start"
        where = "[" + ", ".join(f"{ref}{k:+d}" if k else ref for k in (lo, hi)) + ")"
        owner = "its output" if t is step.out.root else "tensor"
        n = len(bad)
        return (f"guard bytes: step {i} ({'+'.join(step.ops)}, kernel {step.kernel}, on {step.backend}) wrote "
                f"outside {owner} {t.label()} ({t.dtype.name} ne={t.ne}, {b.nbytes} bytes at {b.backend} arena "
                f"+{b.offset}): the guard {which} it has {n} changed byte{'s' if n > 1 else ''} in {where}")
