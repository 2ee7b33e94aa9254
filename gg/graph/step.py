"""Step: one unit of work in a plan (a node, a fused group of nodes, or an inserted transfer/cast)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..tensor import Tensor


@dataclass(eq=False)
class Step:
    """`ops` are the op names computed, in order; `nodes` the graph nodes (the last is `out`).
    `exports` are the other nodes whose values leave the step (read by later steps, or written
    into a persistent tensor): an epilogue fusion's product, rope and cache writes. `subst` maps
    a source tensor to the tensor the step actually reads instead (an inserted transfer or
    cast, or the source of an elided cont: `elided`). `inserted` marks steps the planner added.
    `choice` is the kernel the backend chose for it (`kernel` is its symbol); lowering executes
    that choice and never re-decides."""

    ops: tuple[str, ...]
    nodes: tuple[Tensor, ...]
    backend: str
    kernel: str = ""
    inserted: bool = False
    subst: dict[Tensor, Tensor] = field(default_factory=dict)
    exports: tuple[Tensor, ...] = ()
    choice: Any = None  # the backend's kernel choice (made once, when the plan is made)
    elided: tuple[Tensor, ...] = ()  # conts this step reads the source of instead (elide.py)

    @property
    def out(self) -> Tensor:
        return self.nodes[-1]

    @property
    def outs(self) -> tuple[Tensor, ...]:
        """Every node the step writes where others can see it: `exports`, then `out`."""
        return self.exports + (self.out,)

    def srcs(self, node: Tensor) -> tuple[Tensor, ...]:
        """node.src with planner substitutions applied (what the kernel must read)."""
        return tuple(self.subst.get(s, s) for s in node.src)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """Tensors read from outside the step, in first-use order, after substitution. A view of
        one of the step's own nodes (a cast folded in through a reshape) is read inside."""
        inside = set(self.nodes)
        seen: dict[Tensor, None] = {}
        for n in self.nodes:
            for s in self.srcs(n):
                if s not in inside and s.root not in inside:
                    seen.setdefault(s, None)
        return tuple(seen)

    def __repr__(self) -> str:
        mark = "*" if self.inserted else ""
        return f"Step({'+'.join(self.ops)}{mark} on {self.backend}: {self.kernel}, out ne={self.out.ne})"
