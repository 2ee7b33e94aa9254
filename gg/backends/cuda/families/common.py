"""What every CUDA op family shares: the plan-time kernel choice, catalog entries, dtype codes,
grid limits and the one layout test the 16-byte paths use.

A family module (elementwise.py, norm.py, ...) owns, for its ops: `claims(ops)` (the op groups it
runs), `choose(ops, nodes, srcs)` (the plan-time check *and* kernel choice: a `Kernel` or None),
`lower(rt, step, kernel, what)` (launch records, from the stored choice only), `variants()` (its
catalog), `DEFINES` (its constants, handed to NVRTC as -D so no .cu mirrors a Python number),
and optionally `PATTERNS` (fused groups it declares), `EPILOGUE_OPS`, `src_dtype` and
`workspace_bytes(kernel)` (device memory its lowering needs, planned with the arenas).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence, cast

from ....dtypes import BF16, F16, F32, I32, DType
from ....tensor import Tensor

if TYPE_CHECKING:
    from ..runtime import DeviceBuffer

FLOATS = (F32, F16, BF16)
FLOAT_NAMES = ("f32", "f16", "bf16")
DT_CODES = {F32: 0, F16: 1, BF16: 2, I32: 3}  # kernels/common.cuh DT_* (handed over as -D)
GRID_YZ_MAX = 65535
GRID_X_MAX = 2 ** 31 - 1
ALIGN = 256  # every arena offset and every device buffer gg allocates starts on this boundary

Srcs = Callable[[Tensor], Sequence[Tensor]]


def node_srcs(node: Tensor) -> Sequence[Tensor]:
    return node.src


@dataclass(frozen=True)
class Kernel:
    """A step's kernel, chosen once at plan time and stored on the Step (`step.choice`): the
    source file, the symbol that runs (shown in the plan and the profile) and whatever launch
    constants the family decided (subclasses add typed fields). Lowering never re-decides.

    Device memory the lowering needs is planned with the arenas (counted in `plan.peak_bytes`):
    `scratch` bytes live while the step runs (flash-decoding's partial results), `table` bytes
    for the plan's whole life (a rope frequency table, written once at prepare time).
    `overwrites_residual`: the kernel may write its output over the residual it adds (the last
    node's source from outside the step), which the allocator then hands it where that residual
    dies here (gg/graph/allocate.py)."""

    file: str
    symbol: str
    # the step writes rows of K/V caches from its own products (a QKV step with the rope / cache
    # write epilogue): its blocks hold the SMs right up to the attention that reads them
    epilogue: ClassVar[bool] = False
    scratch: int = field(default=0, kw_only=True)
    table: int = field(default=0, kw_only=True)
    overwrites_residual: bool = field(default=False, kw_only=True)

    def runs(self) -> tuple[tuple[str, str], ...]:
        """(file, symbol) of every kernel of ours the step launches (the catalog has each)."""
        return ((self.file, self.symbol),) if self.file != "cublas" else ()


@dataclass(frozen=True)
class Variant:
    file: str   # kernels/<file>
    name: str   # the extern "C" symbol


def rows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def floats(*ts: Tensor) -> bool:
    return all(t.dtype in FLOATS for t in ts)


def code(t: Tensor) -> int:
    return DT_CODES[t.dtype]


def base_misalignment(t: Tensor) -> int:
    """Bytes past a 256-byte boundary where t's root starts on the device, known at plan time:
    0 for everything gg allocates (arenas, uploaded leaves); a leaf over another library's memory
    (gg.from_dlpack) starts where that library put it."""
    root = t.root
    if root.op is None and root.buffer is not None and getattr(root.buffer, "backend", "") == "cuda":
        return (cast("DeviceBuffer", root.buffer).ptr + root.offset) % ALIGN
    return 0


def aligned(t: Tensor, nbytes: int) -> bool:
    """t's first element starts on an `nbytes` boundary (nbytes divides 256)."""
    return (base_misalignment(t) + t.view_offs) % nbytes == 0


def rows_aligned(t: Tensor, nbytes: int = 16) -> bool:
    """The one test of every wide-access path: contiguous rows, each starting on an `nbytes`
    boundary (every row stride of a dim with ne > 1 a multiple of it)."""
    return (t.nb[0] == t.dtype.size and aligned(t, nbytes)
            and all(nb % nbytes == 0 for ne, nb in zip(t.ne[1:], t.nb[1:]) if ne > 1))


def vec_rows(*ts: Tensor) -> bool:
    """The 8-elements-per-access path of the row kernels applies: every operand has contiguous
    rows of the same length (a multiple of 8) starting on 16-byte boundaries."""
    n = ts[0].ne[0]
    return n % 8 == 0 and all(t.ne[0] == n and rows_aligned(t) for t in ts)


def group(*ts: Tensor) -> int:
    """Elements per vectorized access (kernels/common.cuh Group): 16 bytes of the widest operand."""
    return 16 // max(t.dtype.size for t in ts)


def dtype_name(t: Tensor | DType) -> str:
    return t.name if isinstance(t, DType) else t.dtype.name
