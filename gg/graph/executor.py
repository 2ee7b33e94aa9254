"""Execute a plan: bind memory once (leaves move to their home, arenas), then run prepared
segments. After each run the plan's outputs and kept tensors are published (tensor.publish), so
`numpy()` reads what the last compute that outputs them wrote.

One compute of a plan runs at a time (a per-executor lock), and a backend that is not safe to
drive from several threads at once exposes a `lock` that is held around every compute using it
(CUDA: one stream and a per-thread driver context). In guard mode (guards.py) every step is its
own segment, synchronized and checked after it runs."""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import TYPE_CHECKING, Iterator


from ..backends import base
from ..errors import BackendError, GraphError
from ..tensor import Tensor, _results
from .guards import Guards
from .memory import Memory
from .plan import Plan
from .step import Step

if TYPE_CHECKING:
    from ..buffer import Buffer
    from .profile import Profile


class _Transfer:
    """Copies a tensor from one backend's memory into a contiguous tensor on another's: device to
    device when the destination backend can (`copy_from`: two CUDA devices, no host round trip,
    no wait) and the source is one contiguous range, else through the host."""

    def __init__(self, step: Step, memory: Memory):
        self.memory = memory
        self.dst = step.out
        self.src = step.out.src[0]
        # addresses are fixed once memory is bound: found here, not on every run (decode replays)
        self.to = memory.locate(self.dst)
        self.direct = getattr(base.get(step.backend), "copy_from", None) if self.src.is_contiguous() else None
        if self.direct is not None:
            sbuf, soff = memory.locate(self.src)
            lo, hi = self.src.extent()
            self.source = (sbuf, soff + lo, hi - lo)

    def run(self) -> None:
        buf, off = self.to
        if self.direct is not None:
            if self.direct(buf, off, *self.source):
                return
            self.direct = None  # not device memory on both sides: through the host from now on
        buf.write(off, self.memory.read(self.src))

    def timed_run(self) -> list[float]:
        t0 = time.perf_counter()
        self.run()
        return [time.perf_counter() - t0]


class _Transfers:
    """Consecutive transfers: one segment (profiled as one entry per transfer)."""

    def __init__(self, parts: list[_Transfer]):
        self.parts = parts

    def run(self) -> None:
        for t in self.parts:
            t.run()

    def timed_run(self) -> list[float]:
        return [x for t in self.parts for x in t.timed_run()]


class Executor:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.segments: list = []
        self.used = tuple(dict.fromkeys(s.backend for s in plan.steps))
        self.arenas: dict[str, Buffer] = {}
        self.contexts: set = set()  # of the leaves: a freed one makes every later run an error
        self.memory: Memory | None = None
        self.published: list[tuple[Tensor, tuple]] = []  # (kept root, (buffer, offset)) after each run
        self.guards: Guards | None = None
        self._lock = threading.RLock()
        self._all_locks = self._locks()

    def _locks(self) -> list:
        """This plan's lock, then the locks of the backends it runs on (always in name order)."""
        locks = [getattr(base.get(name), "lock", None) for name in sorted(self.used)]
        return [self._lock] + [lock for lock in locks if lock is not None]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Plain acquire/release (no ExitStack): this wraps every compute and sits on the host path.
        locks = self._all_locks
        for lock in locks:
            lock.acquire()
        try:
            yield
        finally:
            for lock in reversed(locks):
                lock.release()

    def stale(self) -> bool:
        """A leaf this plan meant to place was placed elsewhere (by another plan's compute) since
        the plan was made: the plan must be made again. Once bound, a plan never goes stale:
        a placed leaf stays where it is."""
        return not self.segments and any(leaf.home is not None and leaf.home != home
                                         for leaf, home in self.plan.leaf_homes.items())

    def _bind(self) -> None:
        for name in self.used:
            if not base.available(name):
                raise BackendError(f"compute: the plan runs steps on {name!r} but that backend is not "
                                   f"available on this machine (plan it with backends=('cpu',) instead)")
        for leaf, home in self.plan.leaf_homes.items():  # leaves move to their home once, and stay
            if leaf.home is None:
                leaf.home = home
            elif leaf.home != home:
                raise GraphError(f"compute: leaf {leaf.label()} was placed on {leaf.home!r} after this plan "
                                 f"was made for it on {home!r}; compute the graph again to re-plan")
            self._migrate(leaf)
            if leaf.ctx is not None:
                self.contexts.add(leaf.ctx)
        for name, size in self.plan.alloc.arena_bytes.items():
            self.arenas[name] = base.get(name).alloc(max(size, 1))
        self.memory = memory = Memory(self.arenas, self.plan.alloc.offsets, self.plan.alloc.workspace)
        # each output / kept tensor itself (a view too): another graph computing its root later
        # must not change what this graph returned through the view
        self.published = [(t, memory.locate(t)) for t in self.plan.published]
        guarded = self.plan.alloc.guard > 0
        segments: list = []
        run: list[Step] = []
        for step in self.plan.steps + [None]:  # type: ignore[operator]
            if run and (step is None or step.ops == ("transfer",) or step.backend != run[0].backend or guarded):
                segments.append(base.get(run[0].backend).prepare(run, memory))
                run = []
            if step is None:
                break
            if step.ops == ("transfer",):
                t = _Transfer(step, memory)
                if segments and isinstance(segments[-1], _Transfers) and not guarded:
                    segments[-1].parts.append(t)
                else:
                    segments.append(_Transfers([t]))
            else:
                run.append(step)
        self.guards = Guards(self.plan, self.arenas) if guarded else None
        self.segments = segments  # only now: a bind that failed half-way is redone by the next run

    @staticmethod
    def _migrate(root: Tensor) -> None:
        if root.buffer is not None and root.buffer.backend != root.home:
            nbytes = root.storage_bytes
            data = root.buffer.read(root.offset, nbytes)
            assert root.home is not None  # _bind gave every leaf its home first
            new = base.get(root.home).alloc(nbytes)
            new.write(0, data)
            root.buffer, root.offset = new, 0

    def profile(self, repeat: int = 5) -> Profile:
        """Run the plan `repeat` times, timing every step on its backend (a backend's runnable
        times its own steps: CUDA with events); returns a `Profile` of median times."""
        from .profile import Profile
        with self._locked():
            self.run(sync=True)  # binds memory, compiles, warms caches
            samples: list[list[float]] = []
            for _ in range(max(1, repeat)):
                times: list[float] = []
                for seg in self.segments:
                    times.extend(seg.timed_run())
                samples.append(times)
        return Profile(self.plan, [statistics.median(col) for col in zip(*samples)])

    def run(self, sync: bool = True) -> None:
        locks = self._all_locks  # inlined _locked(): a generator context manager costs microseconds
        for lock in locks:
            lock.acquire()
        try:
            self._run(sync)
        finally:
            for lock in reversed(locks):
                lock.release()

    def _run(self, sync: bool) -> None:
        for c in self.contexts:  # kernels hold raw addresses: never let them touch freed memory
            if c.freed:
                raise GraphError("compute: a leaf of this graph belongs to a freed context; rebuild "
                                 "the graph from live tensors")
        if not self.segments:
            self._bind()
        if self.guards is not None:
            self._run_guarded()
        else:
            for seg in self.segments:
                seg.run()
            if sync:
                for name in self.used:
                    base.get(name).synchronize()
        for t, where in self.published:  # numpy() of an output now reads this run's value
            _results[t] = where

    def _run_guarded(self) -> None:
        """Guard mode: one step per segment; arm its new blocks' guards, run, wait, check."""
        guards = self.guards
        assert guards is not None  # only called when guards are on
        for i, (step, seg) in enumerate(zip(self.plan.steps, self.segments)):
            guards.arm(i)
            seg.run()
            base.get(step.backend).synchronize()
            guards.check(i)
