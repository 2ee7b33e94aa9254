"""Graph: the nodes reachable from the outputs, in ggml's build order (post-order DFS)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from ..backends import base
from ..errors import BackendError, GraphError
from ..tensor import Flag, Tensor

if TYPE_CHECKING:
    from .executor import Executor
    from .plan import Plan
    from .profile import Profile


def _priority(backends: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """`backends` as a tuple of names: one name or a sequence of them (None: the default)."""
    if backends is None:
        return None
    if isinstance(backends, str):
        backends = (backends,)
    try:
        names = tuple(backends)
    except TypeError:
        raise BackendError(f"build_forward: backends must be a name or a sequence of names such as "
                           f"('cuda', 'cpu'), got {backends!r}") from None
    if not names or not all(isinstance(n, str) for n in names):
        raise BackendError(f"build_forward: backends must be a non-empty sequence of backend names, got {backends!r}")
    names = tuple(dict.fromkeys(base.canonical(n) for n in names))  # "cuda:0" is "cuda"
    for n in names:
        base.get(n)  # an unknown name fails here, not at plan time
    return names


class Graph:
    """A forward graph. `nodes` are op tensors in build order, `leafs` the data tensors they read.

    `compute()` plans on first call (see `plan`) and reuses the plan afterwards."""

    def __init__(self, backends: Sequence[str] | str | None = None, fuse: bool = True):
        self.backends = _priority(backends)
        self.fuse = bool(fuse) and os.environ.get("GG_NO_FUSION", "") not in ("1", "true", "yes")
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.kept: list[Tensor] = []  # keep=[...] of build_forward, and nodes marked with t.keep()
        self._seen: set[Tensor] = set()
        self._plan: Plan | None = None
        self._executor: Executor | None = None
        self._keep_epoch = -1

    def build_forward_expand(self, t: Tensor) -> "Graph":
        """Add `t` and everything it depends on (not yet in the graph) after the current nodes."""
        if not isinstance(t, Tensor):
            raise GraphError(f"build_forward_expand: expected a gg.Tensor, got {type(t).__name__}")
        self._visit(t)
        if t not in self.outputs:
            self.outputs.append(t)
        t.flags |= Flag.OUTPUT
        self._plan = self._executor = None
        return self

    def keep(self, *tensors: Tensor) -> "Graph":
        """Keep these tensors' values readable after compute (their memory is not reused and
        they are not fused away). They must be in the graph (or be added later)."""
        for t in tensors:
            if not isinstance(t, Tensor):
                raise GraphError(f"keep: expected gg.Tensor, got {type(t).__name__}")
            if t not in self.kept:
                self.kept.append(t)
        self._plan = self._executor = None
        return self

    def values_kept(self) -> list[Tensor]:
        """Outputs, then the other tensors whose values survive a compute: keep=[...] and
        t.keep()-marked nodes of this graph."""
        marked = [n for n in self.nodes if Flag.KEEP in n.flags]
        return list(dict.fromkeys(self.outputs + [t for t in self.kept if t in self._seen] + marked))

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
    def plan(self) -> Plan:
        """The plan (planned on first access; never touches a device, never changes a tensor)."""
        if self._plan is not None and self._keep_epoch != Tensor.keep_epoch:
            # some tensor was marked with keep() since: re-plan if it is one of ours not yet kept
            self._keep_epoch = Tensor.keep_epoch
            if any(Flag.KEEP in n.flags and n not in self._plan.kept for n in self.nodes):
                self._plan = self._executor = None
        if self._plan is None:
            if not self.outputs:
                raise GraphError("graph: no outputs; add them with build_forward(...) or "
                                 "graph.build_forward_expand(t)")
            from .planner import make_plan
            self._keep_epoch = Tensor.keep_epoch
            self._plan = make_plan(self)
        return self._plan

    def compute(self, sync: bool = True) -> "Graph":
        """Run the graph. With `sync=False` CUDA work is only enqueued (see `gg.synchronize`)."""
        plan = self.plan  # re-plans if a tensor was marked with keep() since
        if self._executor is None:
            from .executor import Executor
            executor = Executor(plan)
            if executor.stale():  # another plan's compute placed one of our leaves elsewhere
                self._plan = None
                executor = Executor(self.plan)
            self._executor = executor
        self._executor.run(sync=sync)
        return self

    def locate(self, t: Tensor) -> tuple[Any, int]:
        """(buffer, byte offset of t's root) in this graph's bound memory: a debugging aid for
        tests and tools (after the first compute)."""
        if self._executor is None or self._executor.memory is None:
            raise GraphError("locate: compute the graph first")
        return self._executor.memory.locate(t)

    def profile(self, repeat: int = 5) -> Profile:
        """Run the graph and time each step (median of `repeat` runs): a table of device time,
        bytes moved, GB/s or TFLOP/s and share of the total. `print(graph.profile())`."""
        self.compute()  # binds memory, compiles, warms caches
        assert self._executor is not None  # compute() made it
        return self._executor.profile(repeat)

    # ---- export --------------------------------------------------------------------------
    def to_networkx(self) -> Any:  # a networkx.DiGraph (networkx is an optional dependency)
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


def build_forward(*outputs: Tensor, backends: Sequence[str] | str | None = None, fuse: bool = True,
                  keep: Sequence[Tensor] = ()) -> Graph:
    """A graph computing `outputs` (in ggml build order). `backends` is a priority list such as
    ("cuda", "cpu") (or one name); None means CUDA when a GPU is present, else CPU. `fuse=False`
    or the environment variable GG_NO_FUSION=1 turn fusion off. `keep` lists intermediates whose
    values stay readable with `numpy()` after compute (like ggml_set_output)."""
    if not outputs:
        raise GraphError("build_forward: give at least one output tensor")
    g = Graph(backends=backends, fuse=fuse)
    for t in outputs:
        g.build_forward_expand(t)
    if isinstance(keep, Tensor):
        keep = (keep,)
    g.keep(*keep)
    for t in g.kept:
        if t not in g._seen:
            raise GraphError(f"build_forward: keep={t.label()} is not part of the graph of these outputs")
    return g
