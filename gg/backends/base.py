"""The Backend protocol and the registry. The planner asks backends what they support; it never
knows their internals, and backends never import the planner.

Two halves:
- planning (no device, no driver import): `supports`, `src_dtype`, `choose`, `patterns`;
- running: `alloc`, `prepare(steps, memory) -> Runnable`, `synchronize`.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any, Iterator, NamedTuple, Protocol, Sequence

from ..dtypes import DType
from ..errors import BackendError
from ..tensor import Tensor


class Runnable(Protocol):
    def run(self) -> None:
        """Enqueue (CUDA) or do (CPU) the work of the prepared steps."""

    def timed_run(self) -> list[float]:
        """Run synchronously, returning each step's time in seconds (device time on a GPU)."""


class Patterns(NamedTuple):
    """The fusions a backend declares (the planner only applies its generic legality rules):
    `chains` are op sequences one step can run (longest first), each intermediate feeding the
    next; `epilogue_ops` are one-node ops a product's step may also do for the rows it writes;
    `siblings` is the most one-column products of the same input one step may compute (0: the
    backend merges none; gg/graph/siblings.py asks `supports` for each group it would make);
    `epilogue_steps`: where a product's step cannot take its epilogue ops, the backend runs them
    as one step of their own (gg/graph/fuse.py fuse_epilogue_steps asks `supports` for the group)."""

    chains: tuple[tuple[str, ...], ...] = ()
    epilogue_ops: tuple[str, ...] = ()
    siblings: int = 0
    epilogue_steps: bool = False


class KernelChoice(Protocol):
    """What a backend decided runs a step (stored on `Step.choice`); `symbol` is shown in the
    plan and the profile."""

    @property
    def symbol(self) -> str: ...  # read-only: backends store frozen choices


class Memory(Protocol):
    """Where a bound plan's tensors live (gg.graph.memory.Memory implements it)."""

    def locate(self, t: Tensor) -> tuple[Any, int]:
        """(buffer, byte offset of t's root in it); t's first element is t.view_offs further."""

    def read(self, t: Tensor) -> Any:
        """t's elements as a contiguous raw-storage numpy array of shape ne[::-1]."""


class Backend(Protocol):
    name: str

    def available(self) -> bool:
        """True when this machine can run the backend (e.g. a GPU and the driver are there)."""

    def supports(self, ops: tuple[str, ...], nodes: Sequence[Tensor]) -> bool:
        """Can one step compute `nodes` (ops in order; a fused group when len > 1)? No device needed."""

    def src_dtype(self, node: Tensor, i: int) -> DType | None:
        """The dtype the kernel for `node` needs for src[i], or None if the current one is fine.
        The planner inserts a cast step where this differs from src[i].dtype."""

    def choose(self, ops: tuple[str, ...], nodes: Sequence[Tensor], srcs: Any = None) -> KernelChoice | None:
        """The kernel for one step (made once at plan time, stored on the Step; lowering only
        executes it), or None if the backend cannot run it. `srcs(node)` gives the sources the
        kernel will read (after the planner's transfers and casts); default node.src."""

    def patterns(self) -> Patterns:
        """The fused groups this backend can run (see Patterns)."""

    # Optional: `after(prev, choice) -> KernelChoice`, the choice for a step given the choice of
    # the step right before it on the same backend (a launch that starts under its predecessor's
    # tail); the planner asks once, after every fusion, and stores the answer (planner.py).
    # Optional: `carry_norm(prev, ops, nodes, srcs, own_step) -> (KernelChoice, KernelChoice) | None`,
    # the choices of a planned step `prev` and of the normalizing group right after it (`ops`: an
    # rms_norm -> mul step merged into the step that reads its row, own_step True; or a step that
    # normalizes its input on the way in, own_step False) when the first carries the norm's
    # row-wise part across the boundary (gg/graph/carry.py); None: the plan stays as it is.

    def alloc(self, nbytes: int) -> Any:
        """A buffer (gg.buffer protocol: backend, nbytes, read, write) of at least nbytes."""

    def prepare(self, steps: Sequence[Any], memory: "Memory") -> Runnable:
        """Turn consecutive steps of this backend into something to run repeatedly. `memory`
        says where every tensor lives (the plan's arenas, the leaves' storage): a backend takes
        addresses from it, never from the tensors. Called once per plan; `run()` on every compute."""

    def synchronize(self) -> None:
        """Wait for all work this backend enqueued."""


_MODULES = {"cpu": "gg.backends.cpu", "cuda": "gg.backends.cuda"}
_instances: dict[str, Backend] = {}
log = logging.getLogger("gg")
_fallback_logged = False  # the "no GPU, computing on the CPU" line is logged once per process


def register(name: str, module: str) -> None:
    """Make a backend known by the module that defines `BACKEND` (instantiated on first use)."""
    _MODULES[name] = module


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def canonical(name: str) -> str:
    """The name a backend is known by: "cuda:0" is "cuda" (device 0), "cuda:N" stays."""
    if isinstance(name, str) and name.startswith("cuda:"):
        index = device_index(name)
        return "cuda" if index == 0 else f"cuda:{index}"
    return name


def device_index(name: str) -> int:
    """N of "cuda:N" (0 for "cuda"); a BackendError for a malformed device name."""
    if name == "cuda":
        return 0
    tail = name[len("cuda:"):] if name.startswith("cuda:") else ""
    if not tail.isdigit() or (len(tail) > 1 and tail[0] == "0"):
        raise BackendError(f"unknown backend {name!r}; CUDA devices are named 'cuda' (or 'cuda:0'), 'cuda:1', ...")
    return int(tail)


def is_cuda(name: str) -> bool:
    return name == "cuda" or name.startswith("cuda:")


def get(name: str) -> Backend:
    """The backend called `name` ("cuda:N": logical CUDA device N). Instantiating it never
    touches a device."""
    if name not in _instances and isinstance(name, str) and name.startswith("cuda:"):
        index = device_index(name)
        cuda = get("cuda")
        _instances[name] = cuda if index == 0 else importlib.import_module(_MODULES["cuda"]).device(index)
    if name not in _instances:
        if name not in _MODULES:
            raise BackendError(f"unknown backend {name!r}; known: {', '.join(_MODULES)}")
        try:
            _instances[name] = importlib.import_module(_MODULES[name]).BACKEND
        except (ImportError, AttributeError) as e:
            raise BackendError(f"backend {name!r} could not be loaded: {e}") from e
    return _instances[name]


def available(name: str) -> bool:
    try:
        return get(name).available()
    except BackendError:
        return False


def default_priority() -> tuple[str, ...]:
    """CUDA first when a GPU is usable here, CPU always last. Computing on the CPU where there is
    no GPU is normal, so the first call only logs one INFO line on the "gg" logger saying why
    (`python -m gg info` shows the same reason)."""
    global _fallback_logged
    if available("cuda"):
        return ("cuda", "cpu")
    if not _fallback_logged:
        _fallback_logged = True
        log.info("gg: no usable CUDA GPU (%s); computing on the CPU backend", cuda_unavailable_reason())
    return ("cpu",)


def cuda_unavailable_reason() -> str:
    """Why the CUDA backend can not run here ("" when it can)."""
    try:
        cuda = get("cuda")
    except BackendError as e:
        return str(e)
    if cuda.available():
        return ""
    return getattr(cuda, "unavailable_reason", "") or "unknown reason"


def synchronize() -> None:
    """Wait for everything every instantiated backend has enqueued."""
    for b in list(_instances.values()):
        b.synchronize()


@contextlib.contextmanager
def gathered_writes() -> Iterator[None]:
    """`Tensor.set` calls inside reach each device together when the scope ends (on CUDA: one
    kernel launch for up to 8 small writes instead of a DMA copy each, ~2.5 µs of GPU time saved
    a write between two decode steps). Anything that reads or computes inside the scope sees the
    writes made before it. Backends without the optional `gathered_writes()` write at once."""
    with contextlib.ExitStack() as scopes:
        for b in {id(b): b for b in _instances.values()}.values():
            if hasattr(b, "gathered_writes"):
                scopes.enter_context(b.gathered_writes())
        yield
