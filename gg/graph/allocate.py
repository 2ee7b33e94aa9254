"""Pass 4, allocate: one arena per backend; offsets from a liveness pass.

An intermediate's bytes are reused once its last reader ran; a single-op elementwise step may
write over its first source in place when that source dies there with an identical layout, and so
may a fused step whose backend's choice says its kernel can write over the residual it adds
(`choice.overwrites_residual`: the last node's source from outside the step).
Leaves, views, this graph's outputs and kept tensors and persistent tensors are never reused.
Other graphs do not matter: each plan has its own arenas.

With `guard` > 0 (GG_DEBUG_GUARDS=1, see guards.py) every block gets `guard` spare bytes before
and after the tensor, so sentinels can sit there; offsets stay 256-aligned. `blocks` records every
block's life (first and last step) either way."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..ops import info
from ..tensor import Tensor
from .step import Step

ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Arena:
    backend: str
    size: int = 0
    free: list[tuple[int, int]] = field(default_factory=list)  # (offset, size), sorted by offset

    def take(self, nbytes: int) -> int:
        nbytes = _align(nbytes)
        for i, (off, size) in enumerate(self.free):
            if size >= nbytes:
                if size == nbytes:
                    self.free.pop(i)
                else:
                    self.free[i] = (off + nbytes, size - nbytes)
                return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.size:  # grow the last free block
            off, _ = self.free.pop()
            self.size = off + nbytes
            return off
        off = self.size
        self.size += nbytes
        return off

    def give(self, off: int, nbytes: int) -> None:
        self.free.append((off, _align(nbytes)))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


@dataclass(eq=False)
class Block:
    """Arena bytes [offset, offset + nbytes) of `backend`, alive from step `first` to step `last`
    (inclusive). `tensors` are (step, tensor) in the order they occupy it (in-place steps add)."""

    backend: str
    offset: int
    nbytes: int
    first: int
    last: int
    tensors: list[tuple[int, Tensor]]

    def tensor_at(self, step: int) -> Tensor:
        """The tensor that holds the block during `step`."""
        held = [t for i, t in self.tensors if i <= step]
        return held[-1] if held else self.tensors[0][1]


@dataclass
class Allocation:
    offsets: dict[Tensor, tuple[str, int]]  # root tensor -> (backend, byte offset in its arena)
    arena_bytes: dict[str, int]             # peak size of each backend's arena
    naive_bytes: dict[str, int]             # what one buffer per tensor would take
    inplace: dict[Tensor, Tensor]           # out -> the source whose bytes it reuses
    reused: frozenset[Tensor] = frozenset()  # intermediates whose bytes something else takes later
    blocks: tuple[Block, ...] = ()           # every block's life, in the order they were taken
    guard: int = 0                           # spare bytes on each side of every block (guards.py)
    # (step, "scratch" | "table") -> (backend, offset): memory a step's kernel needs besides its
    # tensors (Kernel.scratch: while the step runs; Kernel.table: for the plan's life)
    workspace: dict = field(default_factory=dict)


def _size(t: Tensor) -> int:
    return t.storage_bytes  # allocated tensors are contiguous


def _inplace_candidate(s: Step, out: Tensor) -> Tensor | None:
    """The source whose bytes `out` may take: the first source of a single-op step of an in-place
    op, or the residual of a step whose kernel overwrites it (the last node's one source that no
    node of the step computes)."""
    if out is not s.out or not out.src:
        return None
    if len(s.ops) == 1 and info(s.ops[0]).inplace:
        return s.srcs(out)[0]
    if getattr(s.choice, "overwrites_residual", False):
        outside = [t for t in s.srcs(out) if t not in s.nodes]
        return outside[0] if len(outside) == 1 else None
    return None


def allocate(steps: Sequence[Step], kept: Sequence[Tensor], guard: int = 0) -> Allocation:
    """`kept`: the graph's outputs and kept tensors, whose memory is never handed on."""
    keep = {o.root for o in kept}
    owned = [t for s in steps for t in s.outs if t.view_src is None]  # tensors that need arena memory
    mine = set(owned)
    last_use: dict[Tensor, int] = {}
    for i, s in enumerate(steps):
        for t in s.inputs:
            if t.root in mine:
                last_use[t.root] = i
    arenas: dict[str, Arena] = {}
    offsets: dict[Tensor, tuple[str, int]] = {}
    naive: dict[str, int] = {}
    inplace: dict[Tensor, Tensor] = {}
    guard = _align(guard) if guard > 0 else 0
    blocks: dict[Tensor, Block] = {}  # tensor -> the block holding it
    workspace: dict = {}
    for s in steps:  # tables live as long as the plan: taken before any step writes anything
        nbytes = getattr(s.choice, "table", 0)
        if nbytes:
            arena = arenas.setdefault(s.backend, Arena(s.backend))
            naive[s.backend] = naive.get(s.backend, 0) + _align(nbytes)
            workspace[(s, "table")] = (s.backend, arena.take(nbytes))
    for i, s in enumerate(steps):
        made = [t for t in s.outs if t in mine]
        for out in made:
            arena = arenas.setdefault(s.backend, Arena(s.backend))
            naive[s.backend] = naive.get(s.backend, 0) + _align(_size(out) + 2 * guard)
            src0 = _inplace_candidate(s, out)
            if (src0 is not None and src0.view_src is None
                    and src0 in offsets and src0 not in keep and last_use.get(src0) == i
                    and offsets[src0][0] == s.backend and src0.dtype is out.dtype and src0.nb == out.nb
                    and src0 not in inplace.values() and s.inputs.count(src0) == 1
                    and all(t.root is not src0 for t in s.inputs if t is not src0)):
                offsets[out] = offsets[src0]
                inplace[out] = src0
                last_use[src0] = -1  # ownership moves to out
                blocks[out] = blocks[src0]
                blocks[out].tensors.append((i, out))
            else:
                off = arena.take(_size(out) + 2 * guard) + guard
                offsets[out] = (s.backend, off)
                blocks[out] = Block(s.backend, off, _size(out), i, len(steps) - 1, [(i, out)])
            if out not in last_use and out not in keep:
                last_use[out] = i  # never read: free right away
        nbytes = getattr(s.choice, "scratch", 0)
        if nbytes:  # taken while the step runs, free again right after
            arena = arenas.setdefault(s.backend, Arena(s.backend))
            naive[s.backend] = naive.get(s.backend, 0) + _align(nbytes)
            workspace[(s, "scratch")] = (s.backend, arena.take(nbytes))
            arena.give(workspace[(s, "scratch")][1], nbytes)
        for t in {t.root for t in s.inputs} | set(made):
            if t in mine and t not in keep and last_use.get(t) == i:
                be, off = offsets[t]
                arenas[be].give(off - guard, _size(t) + 2 * guard)
                blocks[t].last = i
    reused = frozenset(t for t in offsets if t not in keep)
    return Allocation(offsets, {b: a.size for b, a in arenas.items()}, naive, inplace, reused,
                      tuple(dict.fromkeys(blocks.values())), guard, workspace)
