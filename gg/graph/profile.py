"""Per-step timing of a plan: what a user reads to find the slow kernel."""
from __future__ import annotations

from dataclasses import dataclass

from ..ops import node_info
from ..tensor import Tensor
from .plan import Plan
from .step import Step


def _written(t: Tensor) -> int:
    """Bytes a node writes: a set_rows only its rows, not the whole destination."""
    return (t.src[1].nelements if t.op == "set_rows" else t.nelements) * t.dtype.size


def step_bytes(step: Step) -> int:
    """Fewest bytes the step must move: each input read once, each output written once. The
    destination a cpy or set_rows writes into (a KV cache) is not read."""
    dsts = {n.src[i] for n in step.nodes if (i := node_info(n).dst_index) is not None}
    return (sum(t.storage_bytes for t in step.inputs if t not in dsts)
            + sum(_written(t) for t in step.outs))


def step_flops(step: Step) -> int:
    flops = 0
    for n in step.nodes:
        if n.op == "mul_mat":
            flops += 2 * n.src[0].ne[0] * n.nelements
    return flops


@dataclass
class Profile:
    """Device time per step (seconds, the median of `repeat` timed runs)."""

    plan: Plan
    seconds: list[float]

    @property
    def total(self) -> float:
        return sum(self.seconds)

    def rows(self) -> list[dict]:
        out = []
        for i, (s, t) in enumerate(zip(self.plan.steps, self.seconds)):
            b, f = step_bytes(s), step_flops(s)
            out.append(dict(index=i, ops="+".join(s.ops), backend=s.backend, kernel=s.kernel, us=t * 1e6,
                            bytes=b, gbps=b / t / 1e9 if t > 0 else 0.0,
                            tflops=f / t / 1e12 if t > 0 and f else 0.0,
                            share=t / self.total if self.total > 0 else 0.0))
        return out

    def __str__(self) -> str:
        head = ("#", "ops", "backend", "kernel", "time us", "bytes", "GB/s", "TFLOP/s", "share")
        rows = [head] + [(str(r["index"]), r["ops"], r["backend"], r["kernel"], f"{r['us']:.1f}",
                          str(r["bytes"]), f"{r['gbps']:.0f}", f"{r['tflops']:.1f}" if r["tflops"] else "",
                          f"{100 * r['share']:.1f}%") for r in self.rows()]
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        lines = ["  ".join(v.rjust(w) if c >= 4 else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"total {self.total * 1e6:.1f} us over {len(self.seconds)} steps")
        return "\n".join(lines)
