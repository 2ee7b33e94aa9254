"""Stand-in plans for the CUDA lowering's plan-wide rules (gg.backends.cuda.launch.bound: which step
comes before or after, which bytes some step writes), so rules such as the early reads of weights
are checked without a GPU."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


class PlacedMemory:
    """Every tensor at the offset `where` gives for its root, in one buffer."""

    def __init__(self, where: dict):
        self.where = where

    def locate(self, t):
        return SimpleNamespace(ptr=1 << 32), self.where[t.root]


def stub_step(ops, out, choice: Any = None) -> SimpleNamespace:
    """A step running `ops` that writes `out` (choice: the kernel choice the rule looks at)."""
    return SimpleNamespace(ops=tuple(ops), outs=[out], choice=choice if choice is not None else SimpleNamespace())


def in_plan(fn: Callable[[Any], Any], where: dict, steps: list, i: int) -> Any:
    """fn(steps[i]) while `steps` are the plan being lowered, its tensors placed by `where`."""
    from gg.backends.cuda import launch
    with launch.bound(PlacedMemory(where), steps):
        return fn(steps[i])
