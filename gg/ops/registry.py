"""What the rest of gg may ask about an op without knowing its code: is it metadata-only, may it
write over its first source, does its operand order matter. One entry per op, registered next to its constructor."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tensor import Tensor


@dataclass(frozen=True)
class OpInfo:
    name: str
    metadata_only: bool = False  # a view: no kernel, no copy
    inplace: bool = False        # may write over src[0] when layouts match and src[0] dies here
    dst_index: int | None = None  # index of the src whose bytes the op writes (cpy: 1, set_rows: 0)
    # op(a, b) == op(b, a) wherever both are defined and have the same shape (add, mul): a fused
    # chain may feed either slot; which shapes and dtypes a kernel takes is still its own check
    commutative: bool = False

    @property
    def writes_view(self) -> bool:
        """The result is a view of a destination tensor the op writes into (a KV-cache write)."""
        return self.dst_index is not None


OPS: dict[str, OpInfo] = {}


def register(name: str, **flags: Any) -> OpInfo:
    info = OpInfo(name, **flags)
    OPS[name] = info
    return info


def info(name: str) -> OpInfo:
    return OPS[name]


def node_info(node: Tensor) -> OpInfo:
    """The OpInfo of a computed node's op (a leaf has no op)."""
    assert node.op is not None, f"{node.label()} is a leaf: it has no op"
    return OPS[node.op]
