"""Memory: where the tensors a bound plan touches live.

A plan's computed values live in its own arenas (one per backend, offsets from the allocation
pass); leaves live in their own storage, owned by their context. Backends ask this object for
addresses (`locate`) and never read placement off a tensor, so two plans that share a node never
share its memory."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GraphError
from ..tensor import Tensor, raw_view


class Memory:
    def __init__(self, arenas: dict[str, Any], offsets: dict[Tensor, tuple[str, int]],
                 workspace: dict | None = None):
        self.arenas = arenas
        self._where = {t: (arenas[name], off) for t, (name, off) in offsets.items()}
        self._workspace = {key: (arenas[name], off) for key, (name, off) in (workspace or {}).items()}

    def workspace(self, step: Any, kind: str) -> tuple[Any, int]:
        """(buffer, offset) of the bytes the plan set aside for `step`'s kernel: kind "scratch"
        (alive while the step runs) or "table" (for the plan's life)."""
        try:
            return self._workspace[(step, kind)]
        except KeyError:
            raise GraphError(f"no {kind} memory was planned for step {step}") from None

    def locate(self, t: Tensor) -> tuple[Any, int]:
        """(buffer, byte offset of t's root in it); add t.view_offs for t's first element."""
        root = t.root
        if root.op is None:
            if root.buffer is None:
                why = "belongs to a freed context" if getattr(root.ctx, "freed", False) else "has no storage"
                raise GraphError(f"tensor {t.label()} {why}")
            return root.buffer, root.offset
        try:
            return self._where[root]
        except KeyError:
            raise GraphError(f"tensor {t.label()} has no memory in this plan") from None

    def read(self, t: Tensor) -> np.ndarray:
        """t's elements as a contiguous raw-storage array of shape ne[::-1], from any backend."""
        buf, off = self.locate(t)
        lo, hi = t.extent()
        return np.ascontiguousarray(raw_view(t, buf.read(off + lo, hi - lo)))
