"""GG_DEBUG_GUARDS=1: sentinel bytes around every arena tensor, checked after every step.

The planted faults are kernels that write one byte outside their output (a monkeypatched CPU
kernel; on CUDA an extra stream-ordered memset after the real kernel). Without guards such a
write goes unnoticed; with them the step is named in a gg.BackendError."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cpu import kernels as cpu_kernels
from gg.graph import guards
from reference_helpers import nmse

CPU = ("cpu",)


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.setenv("GG_DEBUG_GUARDS", "1")


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def chain(ctx, x):
    """x -> scale -> silu 'y' -> rms_norm -> add; silu's output is named for the messages."""
    s = gg.scale(x, 0.5)
    y = gg.silu(s)
    y.name = "y"
    return gg.add(gg.rms_norm(y, 1e-6), x)


def running_memory(monkeypatch) -> dict:
    """{"memory": the bound memory of the CPU program running now} (kernels get only values)."""
    from gg.backends import cpu
    seen: dict = {}
    real = cpu._Program._run_step

    def run_step(self, step):
        seen["memory"] = self.memory
        return real(self, step)
    monkeypatch.setattr(cpu._Program, "_run_step", run_step)
    return seen


def plant_cpu(monkeypatch, op: str, where: str):
    """Make the CPU kernel of `op` also flip one byte just before / just after its output."""
    real = cpu_kernels.KERNELS[op]
    seen = running_memory(monkeypatch)

    def bad(node, *args):
        buf, off = seen["memory"].locate(node)
        i = off - 1 if where == "before" else off + node.root.nelements * node.root.dtype.size
        buf.array[i] ^= 0xFF
        return real(node, *args)
    monkeypatch.setitem(cpu_kernels.KERNELS, op, bad)


def test_layout_keeps_guards_between_live_blocks(guarded, rng):
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 3, 37))
    t = x
    for i in range(12):  # reuse and in-place steps, as without guards
        t = gg.rms_norm(t, 1e-6) if i % 3 == 0 else gg.scale(gg.silu(t), 1.5)
    plan = gg.build_forward(t, backends=CPU, fuse=False).plan
    g = plan.alloc.guard
    assert g == guards.GUARD_BYTES
    assert plan.alloc.inplace  # in-place still happens in guard mode
    assert all(off % 256 == 0 for _, off in plan.alloc.offsets.values())
    blocks = plan.alloc.blocks
    for i in range(len(plan.steps)):
        live = sorted((b.offset - g, b.offset + b.nbytes + g) for b in blocks if b.first <= i <= b.last)
        assert all(hi <= lo for (_, hi), (lo, _) in zip(live, live[1:])), f"step {i}: {live}"
        assert all(lo >= 0 and hi <= plan.alloc.arena_bytes["cpu"] for lo, hi in live)


def test_guard_mode_gives_the_same_results(rng, monkeypatch):
    data = f32(rng, 5, 130)

    def run():
        ctx = gg.Context()
        x = ctx.tensor(data)
        y = gg.soft_max_ext(gg.scale(chain(ctx, x), 0.7), scale=1.3)
        g = gg.build_forward(y, backends=CPU)
        g.compute()
        g.compute()
        return y.numpy(), g.plan
    monkeypatch.delenv("GG_DEBUG_GUARDS", raising=False)
    plain, plain_plan = run()
    monkeypatch.setenv("GG_DEBUG_GUARDS", "1")
    got, plan = run()
    assert plain_plan.alloc.guard == 0 and plan.alloc.guard == guards.GUARD_BYTES
    np.testing.assert_array_equal(got, plain)


@pytest.mark.parametrize("where", ["after", "before"])
def test_planted_out_of_bounds_write_is_caught(guarded, rng, monkeypatch, where):
    ctx = gg.Context()
    out = chain(ctx, ctx.tensor(f32(rng, 4, 33)))
    g = gg.build_forward(out, backends=CPU)
    g.compute()  # clean
    plant_cpu(monkeypatch, "silu", where)
    with pytest.raises(gg.BackendError) as e:
        g.compute()
    msg = str(e.value)
    i = [s.ops for s in g.plan.steps].index(("silu",))
    assert f"step {i} (silu, kernel silu_f32, on cpu)" in msg
    assert "'y'" in msg and f"guard {where}" in msg
    assert ("changed byte in [end, end+1)" if where == "after" else "changed byte in [start-1, start)") in msg


def test_without_guards_the_planted_write_goes_unnoticed(rng, monkeypatch):
    monkeypatch.delenv("GG_DEBUG_GUARDS", raising=False)
    ctx = gg.Context()
    g = gg.build_forward(chain(ctx, ctx.tensor(f32(rng, 4, 33))), backends=CPU)
    plant_cpu(monkeypatch, "silu", "after")
    g.compute()  # why the debug mode exists


def test_a_write_into_another_live_tensor_guard_names_it(guarded, rng, monkeypatch):
    # 'y' stays alive (it is read by the add at the end); the rms_norm step scribbles just
    # before y's first byte: the error names the rms_norm step and y's guard.
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 2, 40))
    y = gg.silu(x)
    y.name = "y"
    out = gg.add(y, gg.rms_norm(x, 1e-6))
    g = gg.build_forward(out, backends=CPU, fuse=False)
    real = cpu_kernels.KERNELS["rms_norm"]

    seen = running_memory(monkeypatch)

    def bad(node, a):
        buf, off = seen["memory"].locate(y)
        buf.array[off - 3] = 0
        return real(node, a)
    g.compute()
    monkeypatch.setitem(cpu_kernels.KERNELS, "rms_norm", bad)
    with pytest.raises(gg.BackendError, match=r"step 1 \(rms_norm.*outside tensor 'y'.*guard before"):
        g.compute()


def test_compute_after_a_tripped_guard(guarded, rng, monkeypatch):
    data = f32(rng, 3, 70)
    ctx = gg.Context()
    x = ctx.tensor(data)
    out = chain(ctx, x)
    g = gg.build_forward(out, backends=CPU)
    g.compute()
    want = out.numpy()
    with monkeypatch.context() as m:
        plant_cpu(m, "silu", "after")
        with pytest.raises(gg.BackendError, match="guard after"):
            g.compute()
    g.compute()  # kernel fixed: guards are re-armed, the result is right again
    np.testing.assert_array_equal(out.numpy(), want)


def test_guards_with_a_second_backend(guarded, rng):
    import fake_backend  # noqa: F401  (registers "fake": transfers and casts between two arenas)
    ctx = gg.Context()
    x, w = ctx.tensor(f32(rng, 4, 64)), ctx.tensor(f32(rng, 64), dtype=gg.F16)
    y = gg.soft_max(gg.scale(gg.mul(gg.rms_norm(x, 1e-6), w), 0.3))
    r = gg.rope(gg.reshape(y, 16, 4, 4), ctx.tensor(np.arange(4, dtype=np.int32)), 16)
    g = gg.build_forward(r, backends=("fake", "cpu"))
    assert {s.backend for s in g.plan.steps} == {"fake", "cpu"}
    g.compute()
    got = r.numpy()
    ref = gg.build_forward(r, backends=CPU)
    ref.compute()
    assert nmse(got, r.numpy()) < 1e-7


# ---- CUDA -------------------------------------------------------------------------------------
def plant_cuda(monkeypatch, op: str, where: str):
    """Lower `op` as usual plus a memset of 4 bytes just before / after its output, enqueued on
    the backend stream after the kernel (what an out-of-bounds store would do)."""
    from gg.backends.cuda import program
    from gg.backends.cuda.runtime import check, cu
    real = program.lower

    def lower(rt, step, index):
        recs = real(rt, step, index)
        if step.ops == (op,):
            from gg.backends.cuda.launch import addr
            root = step.out.root
            base = addr(root)
            ptr = base - 4 if where == "before" else base + root.nelements * root.dtype.size
            recs = list(recs) + [lambda: check(cu.cuMemsetD8Async(ptr, 0x7F, 4, rt.stream), "planted write")]
        return recs
    monkeypatch.setattr(program, "lower", lower)


@pytest.mark.cuda
@pytest.mark.parametrize("where", ["after", "before"])
def test_planted_out_of_bounds_write_is_caught_on_cuda(guarded, rng, monkeypatch, where):
    ctx = gg.Context()
    data = f32(rng, 4, 1000)
    out = chain(ctx, ctx.tensor(data))
    g = gg.build_forward(out, backends=("cuda", "cpu"))
    assert {s.backend for s in g.plan.steps} == {"cuda"}
    plant_cuda(monkeypatch, "silu", where)
    with pytest.raises(gg.BackendError) as e:
        g.compute()
    msg = str(e.value)
    i = [s.ops for s in g.plan.steps].index(("silu",))
    assert f"step {i} (silu, kernel silu_f32, on cuda)" in msg and "'y'" in msg and f"guard {where}" in msg
    assert not any(seg.use_graph for seg in g._executor.segments if hasattr(seg, "use_graph"))


@pytest.mark.cuda
def test_guard_mode_on_cuda_gives_the_cpu_results(guarded, rng):
    data = f32(rng, 6, 257)
    res = {}
    for backends in (("cuda", "cpu"), CPU):
        ctx = gg.Context()
        y = gg.soft_max_ext(gg.scale(chain(ctx, ctx.tensor(data)), 0.7), scale=1.3)
        g = gg.build_forward(y, backends=backends)
        assert g.plan.alloc.guard == guards.GUARD_BYTES
        g.compute()
        g.compute()
        res[backends] = y.numpy()
    assert nmse(res[("cuda", "cpu")], res[CPU]) <= 1e-6
