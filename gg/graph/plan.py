"""Plan: the ordered steps gg will run, with where each runs, what it fused and inserted, and memory."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..tensor import Tensor
from .allocate import Allocation
from .step import Step


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: int) -> str:
    """n bytes with three significant digits in the largest binary unit that keeps the number at
    least 1: 512 B, 1.50 KiB, 12.8 MiB, 954 MiB, 3.64 TiB."""
    if abs(n) < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1023.5 or unit == _UNITS[-1]:  # 1023.7 KiB prints as 1.00 MiB, not 1024 KiB
            break
    digits = 2 if abs(value) < 9.995 else 1 if abs(value) < 99.95 else 0  # thresholds: after rounding
    return f"{value:.{digits}f} {unit}"


@dataclass
class Plan:
    """What `graph.compute()` runs. `steps` are in execution order; `alloc` holds the arena offsets.
    `kept` are the computed roots whose values survive a compute (outputs and kept tensors);
    `leaf_homes` where each leaf must live when the plan runs (the executor moves an unplaced
    leaf there on the first compute)."""

    steps: list[Step]
    alloc: Allocation
    backends: tuple[str, ...]
    outputs: Sequence[Tensor]
    kept: frozenset[Tensor] = frozenset()
    published: tuple[Tensor, ...] = ()  # the outputs and kept tensors themselves (views too)
    leaf_homes: dict[Tensor, str] = field(default_factory=dict)

    @property
    def fused(self) -> list[Step]:
        return [s for s in self.steps if len(s.ops) > 1]

    @property
    def inserted(self) -> list[Step]:
        return [s for s in self.steps if s.inserted]

    @property
    def arena_bytes(self) -> dict[str, int]:
        return dict(self.alloc.arena_bytes)

    @property
    def peak_bytes(self) -> int:
        return sum(self.alloc.arena_bytes.values())

    def summary(self) -> str:
        transfers = sum(1 for s in self.steps if s.ops == ("transfer",))
        casts = sum(1 for s in self.steps if s.inserted and s.ops == ("cast",))
        elided = sum(len(s.elided) for s in self.steps)
        fused = self.fused
        arenas = ", ".join(f"{b} {human_bytes(n)} (naive {human_bytes(self.alloc.naive_bytes.get(b, 0))})"
                           for b, n in self.alloc.arena_bytes.items()) or "none"
        return (f"{len(self.steps)} steps, {len(fused)} fused groups ({sum(len(s.ops) for s in fused)} ops), "
                f"{transfers} transfers, {casts} casts inserted" + (f", {elided} cont elided" if elided else "")
                + f"; arenas: {arenas}"
                + (f"; {self.alloc.guard}-byte guards (GG_DEBUG_GUARDS)" if self.alloc.guard else ""))

    def __str__(self) -> str:
        def where(t: Tensor) -> tuple[str, str, str]:  # out, bytes, mem columns of a written tensor
            ne = "x".join(str(n) for n in t.ne[:t.n_dims])
            if t.view_src is not None:
                mem = f"-> {t.view_src.label()}"
            elif t in self.alloc.offsets:
                be, off = self.alloc.offsets[t]
                mem = f"{be}+{off}" + (" (in-place)" if t in self.alloc.inplace else "")
            else:
                mem = ""
            return f"{t.dtype.name}[{ne}]", human_bytes(t.storage_bytes), mem

        rows = [("#", "ops", "backend", "kernel", "out", "bytes", "mem")]
        for i, s in enumerate(self.steps):
            ops = "+".join(s.ops) + (" *" if s.inserted else "")
            rows.append((str(i), ops, s.backend, s.kernel, *where(s.out)))
            for t in s.exports:  # the other values an epilogue fusion writes
                rows.append(("", f"  and {t.op}", "", "", *where(t)))
            for t in s.elided:  # a cont made unnecessary: the step reads its source (shown) itself
                rows.append(("", "  cont elided", "", "", *where(s.subst.get(t, t.src[0]))))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        starred = any(s.inserted for s in self.steps)
        lines.append(self.summary() + ("   (* = inserted by the planner)" if starred else ""))
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz DOT: one box per step (fused steps list their ops), inserted steps dashed."""
        producer = {t: i for i, s in enumerate(self.steps) for t in s.outs}
        lines = ["digraph plan {", "  rankdir=TB; node [shape=box, fontname=monospace];"]
        for i, s in enumerate(self.steps):
            style = ", style=dashed" if s.inserted else (", style=bold" if len(s.ops) > 1 else "")
            label = f"{i}: {' + '.join(s.ops)}\\n{s.kernel} [{s.backend}]"
            lines.append(f'  s{i} [label="{label}"{style}];')
        for i, s in enumerate(self.steps):
            for t in s.inputs:
                src = t
                while src not in producer and src.op is not None and src.src and src.view_src is not None:
                    src = src.src[0]  # walk back through views to the step that wrote the bytes
                if src in producer:
                    lines.append(f"  s{producer[src]} -> s{i};")
        lines.append("}")
        return "\n".join(lines)
