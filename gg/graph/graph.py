"""Graph: the nodes reachable from the outputs, in ggml's build order (post-order DFS)."""
from __future__ import annotations

import os
from typing import Sequence

from ..errors import GraphError
from ..tensor import Flag, Tensor

# Bumped whenever a computed tensor first becomes some graph's output: plans made earlier may have
# reused its memory as an intermediate and must be re-made (see `Graph.compute`).
_outputs_epoch = 0


class Graph:
    """A forward graph. `nodes` are op tensors in build order, `leafs` the data tensors they read.

    `compute()` plans on first call (see `plan`) and reuses the plan afterwards."""

    def __init__(self, backends: Sequence[str] | None = None, fuse: bool = True):
        self.backends = tuple(backends) if backends is not None else None
        self.fuse = fuse and os.environ.get("GG_NO_FUSION", "") not in ("1", "true", "yes")
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self._seen: set[Tensor] = set()
        self._plan = None
        self._executor = None
        self._epoch = -1

    def build_forward_expand(self, t: Tensor) -> "Graph":
        """Add `t` and everything it depends on (not yet in the graph) after the current nodes."""
        if not isinstance(t, Tensor):
            raise GraphError(f"build_forward_expand: expected a gg.Tensor, got {type(t).__name__}")
        self._visit(t)
        if t not in self.outputs:
            self.outputs.append(t)
        if t.op is not None and Flag.OUTPUT not in t.flags:
            global _outputs_epoch
            _outputs_epoch += 1
        t.flags |= Flag.OUTPUT
        self._plan = self._executor = None
        return self

    def _visit(self, root: Tensor) -> None:
        # Iterative post-order DFS (deep graphs must not hit Python's recursion limit).
        visiting: set[Tensor] = set()
        stack: list[tuple[Tensor, int]] = [(root, 0)]
        while stack:
            t, i = stack.pop()
            if t in self._seen:
                continue
            if i == 0:
                if t in visiting:
                    raise GraphError(f"graph: cycle through tensor {t.label()}")
                visiting.add(t)
            if i < len(t.src):
                stack.append((t, i + 1))
                s = t.src[i]
                if s in visiting:
                    raise GraphError(f"graph: cycle: {t.label()} depends on {s.label()} which depends on it")
                if s not in self._seen:
                    stack.append((s, 0))
                continue
            visiting.discard(t)
            self._seen.add(t)
            (self.leafs if t.op is None else self.nodes).append(t)

    def use_counts(self) -> dict[Tensor, int]:
        """How many graph nodes read each tensor (ggml's n_children)."""
        counts: dict[Tensor, int] = {t: 0 for t in self.leafs + self.nodes}
        for n in self.nodes:
            for s in set(n.src):
                counts[s] += 1
        return counts

    # ---- planning and running ------------------------------------------------------------
    @property
    def plan(self):
        """The plan (planned on first access; never touches a device)."""
        if self._plan is not None and self._epoch != _outputs_epoch:
            # Another graph made one of our intermediates its output: if we reuse its memory, re-plan.
            self._epoch = _outputs_epoch
            if any(Flag.OUTPUT in t.flags for t in self._plan.alloc.reused):
                self._plan = self._executor = None
        if self._plan is None:
            from .planner import make_plan
            self._epoch = _outputs_epoch
            self._plan = make_plan(self)
        return self._plan

    def compute(self, sync: bool = True) -> "Graph":
        """Run the graph. With `sync=False` CUDA work is only enqueued (see `gg.synchronize`)."""
        plan = self.plan  # re-plans if the memory plan became stale
        if self._executor is None:
            from .executor import Executor
            self._executor = Executor(plan)
        self._executor.run(sync=sync)
        return self

    def profile(self, repeat: int = 5):
        """Run the graph and time each step (median of `repeat` runs): a table of device time,
        bytes moved, GB/s or TFLOP/s and share of the total. `print(graph.profile())`."""
        if self._executor is None:
            from .executor import Executor
            self._executor = Executor(self.plan)
        return self._executor.profile(repeat)

    # ---- export --------------------------------------------------------------------------
    def to_networkx(self):
        """A networkx.DiGraph with an edge src -> node for every dependency."""
        import networkx as nx
        g = nx.DiGraph()
        for t in self.leafs + self.nodes:
            g.add_node(id(t), tensor=t, op=t.op or "leaf", name=t.name, ne=t.ne, dtype=t.dtype.name)
        for n in self.nodes:
            for s in n.src:
                g.add_edge(id(s), id(n))
        return g

    def to_dot(self) -> str:
        """Graphviz DOT of the plan's steps."""
        return self.plan.to_dot()

    def __repr__(self) -> str:
        return f"Graph({len(self.nodes)} nodes, {len(self.leafs)} leafs, outputs={[o.label() for o in self.outputs]})"


def build_forward(*outputs: Tensor, backends: Sequence[str] | None = None, fuse: bool = True) -> Graph:
    """A graph computing `outputs` (in ggml build order). `backends` is a priority list such as
    ("cuda", "cpu"); None means CUDA when a GPU is present, else CPU. `fuse=False` or the
    environment variable GG_NO_FUSION=1 turn fusion off."""
    if not outputs:
        raise GraphError("build_forward: give at least one output tensor")
    g = Graph(backends=backends, fuse=fuse)
    for t in outputs:
        g.build_forward_expand(t)
    return g
