"""A prepared run of consecutive CUDA steps: launch records, optionally replayed as a CUDA graph.

The first `run()` captures every launch of the segment into a CUDA graph (addresses are fixed
once memory is bound, so the graph stays valid for the plan's life) and later runs replay it
with one driver call. `GG_NO_CUDA_GRAPH=1` turns capture off, and so does guard mode
(`GG_DEBUG_GUARDS=1`, where the executor runs and checks one step at a time); a capture the
driver refuses falls back to plain launches, once and for good. Every entry point holds the
runtime's lock with the context current in the calling thread (`rt.enter()`).
"""
from __future__ import annotations

import gc
import os
from typing import Any, Callable, Sequence, cast

from ...errors import BackendError
from .branches import side_steps
from .launch import Launch, bound
from .families import lower
from .driver import check, cu


class Program:
    def __init__(self, rt, steps: Sequence, memory):
        self.rt = rt
        self.steps = list(steps)
        self.graph_exec = None
        with rt.enter(), bound(memory, steps):
            self.per_step: list[list[Callable[[], None]]] = [lower(rt, s, i) for i, s in enumerate(self.steps)]
        self.records = [r for rs in self.per_step for r in rs]
        self.names = [f"{'+'.join(s.ops)} ({s.kernel})" for s in self.steps]
        del self.names[64:]  # enough to find a faulting kernel; bounded for huge plans
        self.use_graph = (os.environ.get("GG_NO_CUDA_GRAPH", "") != "1" and len(self.records) > 1
                          and os.environ.get("GG_DEBUG_GUARDS", "") not in ("1", "true", "yes"))
        self.graph_error: str | None = None
        # steps that run beside the others inside the captured graph (GG_NO_BRANCHES=1: none)
        with bound(memory):
            self.branches = (side_steps(self.steps, self.per_step)
                             if self.use_graph and os.environ.get("GG_NO_BRANCHES", "") != "1" else [])

    def _launch_all(self) -> None:
        for r in self.records:
            r()

    def run(self) -> None:
        with self.rt.enter():
            self._run()

    def _run(self) -> None:
        self.rt.flush_writes()  # inputs set inside a gathered() scope land before the steps read them
        self.rt.in_flight.extend(self.names)
        if len(self.rt.in_flight) > 256:  # many runs without a sync: keep the latest
            del self.rt.in_flight[:-64]
        if self.graph_exec is not None:
            check(cu.cuGraphLaunch(self.graph_exec, self.rt.stream), "replaying the CUDA graph")
            return
        if self.use_graph:
            self._capture()
            if self.graph_exec is not None:
                check(cu.cuGraphLaunch(self.graph_exec, self.rt.stream), "launching the CUDA graph")
                return
        self._launch_all()

    def _capture(self) -> None:
        stream = self.rt.stream
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        # No garbage collection while capturing: a DeviceBuffer freed now would synchronize the
        # stream and free memory, both illegal during capture.
        gc_was_on = gc.isenabled()
        gc.disable()
        check(cu.cuStreamBeginCapture(stream, mode), "starting CUDA graph capture")
        try:
            self._capture_launches(stream)
        finally:
            if gc_was_on:
                gc.enable()

    def _launch_branched(self, stream) -> None:
        """The launches for a capture: a branch step goes to the side stream after the event of
        the step it depends on, and the main stream waits for it before its join step (events
        inside a capture only become edges of the graph)."""
        if not self.branches:
            self._launch_all()
            return
        side, flags = self.rt.side_stream(), cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        by_step = {b.step: b for b in self.branches}
        forks = {b.after for b in self.branches}
        done: dict[int, Any] = {}  # step index -> its CUevent (a cuda-python handle)
        joins: dict[int, list[Any]] = {}

        def record(on) -> object:
            (e,) = check(cu.cuEventCreate(flags), "cuEventCreate")
            self._capture_events.append(e)  # destroyed once the capture has ended
            check(cu.cuEventRecord(e, on), "cuEventRecord")
            return e
        if -1 in forks:
            done[-1] = record(stream)
        for i, recs in enumerate(self.per_step):
            for e in joins.pop(i, []):
                check(cu.cuStreamWaitEvent(stream, e, 0), "cuStreamWaitEvent")
            b = by_step.get(i)
            if b is None:
                for r in recs:
                    r()
                if i in forks:
                    done[i] = record(stream)
                continue
            check(cu.cuStreamWaitEvent(side, done[b.after], 0), "cuStreamWaitEvent")
            for r in recs:
                launch = cast(Launch, r)  # side_steps takes only steps made of Launch records
                launch.set_stream(side)
                try:
                    launch()
                finally:
                    launch.set_stream(stream)
            e = record(side)
            joins.setdefault(b.join, []).append(e)
            if i in forks:
                done[i] = e
        for e in joins.pop(len(self.per_step), []):
            check(cu.cuStreamWaitEvent(stream, e, 0), "cuStreamWaitEvent")

    def _capture_launches(self, stream) -> None:
        self._capture_events: list = []
        try:
            self._launch_branched(stream)
        except BackendError as e:
            err, graph = cu.cuStreamEndCapture(stream)
            self._destroy_capture_events()
            if int(err) == 0 and graph is not None:
                cu.cuGraphDestroy(graph)
            self.use_graph, self.graph_error = False, str(e)
            return  # run() falls back to plain launches, which report a real error if there is one
        err, graph = cu.cuStreamEndCapture(stream)
        self._destroy_capture_events()
        if int(err) != 0:
            self.use_graph, self.graph_error = False, f"cuStreamEndCapture: {err}"
            return
        err, exe = cu.cuGraphInstantiate(graph, 0)
        cu.cuGraphDestroy(graph)
        if int(err) != 0:
            self.use_graph, self.graph_error = False, f"cuGraphInstantiate: {err}"
            return
        self.graph_exec = exe

    def _destroy_capture_events(self) -> None:
        for e in self._capture_events:
            cu.cuEventDestroy(e)
        self._capture_events = []

    def timed_run(self) -> list[float]:
        """Each step's device time in seconds, measured with events around its launches."""
        with self.rt.enter():
            return self._timed_run()

    def _timed_run(self) -> list[float]:
        rt = self.rt
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT
        events = [check(cu.cuEventCreate(flags), "cuEventCreate")[0] for _ in range(len(self.steps) + 1)]
        try:
            rt.flush_writes()
            check(cu.cuEventRecord(events[0], rt.stream), "cuEventRecord")
            for i, recs in enumerate(self.per_step):
                for r in recs:
                    r()
                check(cu.cuEventRecord(events[i + 1], rt.stream), "cuEventRecord")
            rt.synchronize("a timed run")
            times = []
            for i in range(len(self.steps)):
                (ms,) = check(cu.cuEventElapsedTime(events[i], events[i + 1]), "cuEventElapsedTime")
                times.append(ms / 1e3)
            return times
        finally:
            for e in events:
                cu.cuEventDestroy(e)

    def __del__(self) -> None:
        if self.graph_exec is not None and cu is not None:
            try:
                with self.rt.enter():
                    cu.cuGraphExecDestroy(self.graph_exec)
            except Exception:
                pass
