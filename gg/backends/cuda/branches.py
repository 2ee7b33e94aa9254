"""Independent steps of a captured CUDA graph: which steps may run on a second stream.

Steps are launched in plan order on one stream. Inside a captured graph, a step that neither
reads nor writes the bytes of the steps between its last dependency and the next step that needs
it can run beside them instead: in a decode step the V cache write depends only on the QKV
product, not on rope or the K write that come before it in the plan; in a prefill, the V write
also overlaps the K·q product and the softmax. Dependencies are found from device byte ranges
after memory is bound, so they also cover reuse of arena memory (a buffer freed by the serial
order and handed to a later step is a write-after-read conflict like any other).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .launch import Launch, span
from .launch import writes as step_writes


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(lo < h and l < hi for lo, hi in a for l, h in b)


@dataclass(frozen=True)
class Branch:
    """Step `step` runs on the side stream once step `after` is done (-1: at the start) and the
    main stream waits for it before step `join` (len(steps): at the end)."""

    step: int
    after: int
    join: int


def side_steps(steps: Sequence, per_step: Sequence[Sequence]) -> list[Branch]:
    """Steps that can leave the main stream: only gg's own kernels (cuBLAS calls share a
    workspace and a stream-bound handle), never the first step, and only where the step does not
    depend on the one right before it (otherwise nothing would overlap)."""
    reads = [[span(t) for t in s.inputs] for s in steps]
    writes = [step_writes(s) for s in steps]

    def conflict(i: int, j: int) -> bool:
        return (_overlap(writes[i], reads[j]) or _overlap(writes[i], writes[j])
                or _overlap(reads[i], writes[j]))

    out: list[Branch] = []
    side: set[int] = set()
    n = len(steps)
    for j in range(1, n):
        if not per_step[j] or not all(isinstance(r, Launch) for r in per_step[j]):
            continue
        # Waiting for main-stream step `after` orders j after every main step up to it; an earlier
        # side step is ordered by the side stream itself. So `after` is the last conflicting step
        # on the main stream: a side step's event would not cover a main step it ran beside.
        needs = [i for i in range(j) if conflict(i, j)]
        if needs and needs[-1] == j - 1:
            continue  # it needs the step right before it: nothing would overlap
        after = max((i for i in needs if i not in side), default=-1)
        join = next((m for m in range(j + 1, n) if conflict(j, m)), n)
        out.append(Branch(j, after, join))
        side.add(j)
    return out
