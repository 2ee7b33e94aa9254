"""Fault paths: what a user sees when memory runs out, a kernel does not compile, the disk cache
is damaged, there is no GPU, tensors of dead or foreign contexts are mixed in, a compute fails
and is retried, or two threads compute at once. Every one is a clear gg error (or a correct
result), never a crash and never silent garbage. Tests marked `cuda` need a GPU."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np
import pytest

import gg
from gg.backends import base
from gg.backends.cpu import kernels as cpu_kernels
from reference_helpers import nmse

CPU = ("cpu",)
CUDA = ("cuda", "cpu")
cuda = pytest.mark.cuda


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def raises(exc):
    """A stand-in kernel / prepare that fails with `exc`."""
    def fail(*args, **kwargs):
        raise exc
    return fail


def small_graph(backends, data):
    """A little graph with a reduction, a fusion and a reuse; returns (graph, out, float64 ref)."""
    ctx = gg.Context()
    x = ctx.tensor(data)
    y = gg.soft_max(gg.scale(gg.rms_norm(x, 1e-6), 0.5))
    x64 = data.astype(np.float64)
    r = 0.5 * x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    e = np.exp(r - r.max(-1, keepdims=True))
    return gg.build_forward(y, backends=backends), y, e / e.sum(-1, keepdims=True)


def huge_graph(backends):
    """get_rows of one 32 MiB row 2**24 times: the F32 output needs 2**50 bytes (1 PiB), more
    than any device has and more than a 47-bit address space can map, whatever the overcommit."""
    ctx = gg.Context()
    a = ctx.new_tensor(gg.F16, (1 << 24, 1))
    idx = ctx.new_tensor(gg.I32, (1 << 24,))  # all zeros: valid indices
    return gg.build_forward(gg.get_rows(a, idx), backends=backends)


# ---- out of memory ----------------------------------------------------------------------------
def _out_of_memory_then_recover(backends, rng):
    g = huge_graph(backends)
    for _ in range(2):  # and again: the same clear error, never a crash
        with pytest.raises(gg.OutOfMemoryError) as e:
            g.compute()
        assert e.value.nbytes >= 1 << 50 and str(e.value.nbytes) in str(e.value)
    data = f32(rng, 3, 100)
    g2, y, ref = small_graph(backends, data)
    g2.compute()
    assert nmse(y.numpy(), ref) <= 1e-6


def test_out_of_memory_for_a_leaf(rng):
    ctx = gg.Context()
    with pytest.raises(gg.OutOfMemoryError) as e:
        ctx.new_tensor(gg.F32, (1 << 24, 1 << 24), name="huge")
    assert e.value.nbytes == 1 << 50 and str(1 << 50) in str(e.value) and "'huge'" in str(e.value)
    assert ctx.tensor(f32(rng, 4)).numpy().shape == (4,)  # the context is still usable


def test_out_of_memory_cpu(rng):
    _out_of_memory_then_recover(CPU, rng)


@cuda
def test_out_of_memory_cuda_graph_then_a_normal_graph(rng):
    assert huge_graph(CUDA).plan.steps[-1].backend == "cuda"
    _out_of_memory_then_recover(CUDA, rng)


# ---- compilation and the disk cache (NVRTC needs no GPU) ---------------------------------------
def _compiler():
    try:
        from gg.backends.cuda import compiler
        compiler.nvrtc_version()
        return compiler
    except Exception as e:
        pytest.skip(f"NVRTC not importable: {e}")


BAD_SRC = 'extern "C" __global__ void k(float* p) { p[0] = undefined_thing(threadIdx.x); }'
GOOD_SRC = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 2.0f; }'


def test_compile_error_has_the_log_and_caches_nothing(tmp_path, monkeypatch):
    compiler = _compiler()
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_memory", {})
    with pytest.raises(gg.CompileError) as e:
        compiler.compile_source(BAD_SRC, "bad.cu", "sm_80")
    msg = str(e.value)
    assert "bad.cu" in msg and "sm_80" in msg and "undefined_thing" in msg and "error" in msg  # NVRTC's log
    assert isinstance(e.value, gg.BackendError)
    assert not compiler._memory
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing on disk, no temp files
    with pytest.raises(gg.CompileError):  # tried again: compiled again, same error
        compiler.compile_source(BAD_SRC, "bad.cu", "sm_80")
    assert compiler.compile_source(GOOD_SRC, "good.cu", "sm_80")  # the compiler is still usable


@pytest.mark.parametrize("damage", ["empty", "header-only", "half", "one-byte-short", "bad-magic", "garbage"])
def test_damaged_cache_entry_is_recompiled(tmp_path, monkeypatch, damage):
    compiler = _compiler()
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_memory", {})
    good = compiler.compile_source(GOOD_SRC, "k.cu", "sm_80")
    (entry,) = list((tmp_path / "cubin").glob("*.cubin"))
    blob = entry.read_bytes()
    head = len(compiler._MAGIC) + 32
    bad = {"empty": b"", "header-only": blob[:head], "half": blob[:len(blob) // 2],
           "one-byte-short": blob[:-1], "bad-magic": b"XXXXXXXX" + blob[8:],
           "garbage": bytes(range(256)) * 4}[damage]
    entry.write_bytes(bad)
    compiler._memory.clear()
    assert compiler.compile_source(GOOD_SRC, "k.cu", "sm_80") == good
    assert entry.read_bytes() == blob  # rewritten with a good entry
    assert compiler._load_disk(entry) == good


@cuda
@pytest.mark.parametrize("tile", [16, 8])
def test_a_constant_changed_in_process_loads_kernels_built_with_it(rng, monkeypatch, tile):
    """Kernels are looked up under their file's -D constants: after copy.TILE and its CPY_TILE
    change (an A/B switch, a test), the transposing copy launches a kernel built with the new tile,
    not the one already loaded for the old (whose (TILE, 8) blocks would leave columns unwritten or
    index past its shared tile)."""
    from gg.backends.cuda import runtime
    from gg.backends.cuda.families import copy
    rt = runtime.get()
    data = f32(rng, 45, 70)

    def transposed():
        y = gg.cont(gg.transpose(gg.Context().tensor(data)))
        g = gg.build_forward(y, backends=("cuda",))
        (step,) = g.plan.steps
        g.compute()
        assert np.array_equal(y.numpy(), data.T)
        return rt.function(step.choice.file, step.kernel)

    before = transposed()
    monkeypatch.setattr(copy, "TILE", tile)
    monkeypatch.setitem(copy.DEFINES["cpy.cu"], "CPY_TILE", tile)
    assert transposed() != before
    monkeypatch.undo()
    assert transposed() == before  # the first module is still there, not rebuilt


@cuda
def test_kernel_that_fails_to_compile_at_compute_then_fixed(rng, tmp_path, monkeypatch):
    """A broken kernel source makes compute raise CompileError (with the log); once the source
    is right again, the same graph computes (its half-done bind is redone)."""
    from gg.backends.cuda import compiler, runtime
    rt = runtime.get()
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_memory", {})
    monkeypatch.setattr(rt, "_modules", {})
    monkeypatch.setattr(rt, "_functions", {})
    real = compiler.source
    monkeypatch.setattr(compiler, "source", lambda f: real(f) + "\nthis is not C++;\n" if f == "unary.cu" else real(f))
    ctx = gg.Context()
    data = f32(rng, 3, 50)
    y = gg.silu(ctx.tensor(data))
    g = gg.build_forward(y, backends=CUDA)
    with pytest.raises(gg.CompileError, match="unary.cu"):
        g.compute()
    assert not list(tmp_path.rglob("*.cubin"))  # nothing cached for the broken source
    monkeypatch.setattr(compiler, "source", real)
    g.compute()
    x64 = data.astype(np.float64)
    assert nmse(y.numpy(), x64 / (1 + np.exp(-x64))) <= 1e-7


# ---- no GPU: CPU with one log line ------------------------------------------------------------
@pytest.mark.parametrize("installed", [True, False])
def test_no_gpu_falls_back_to_cpu_with_one_log_line(rng, monkeypatch, caplog, installed):
    be = base.get("cuda")
    monkeypatch.setattr(be, "_available", False)
    monkeypatch.setattr(be, "unavailable_reason", "cuInit: CUDA_ERROR_NO_DEVICE")
    monkeypatch.setattr(be, "installed", installed)
    monkeypatch.setattr(base, "_fallback_logged", False)
    caplog.set_level(logging.DEBUG, logger="gg")
    for _ in range(3):
        g, y, ref = small_graph(None, f32(rng, 2, 40))
        assert g.plan.backends == CPU and {s.backend for s in g.plan.steps} == {"cpu"}
        g.compute()
        assert nmse(y.numpy(), ref) <= 1e-6
    records = [r for r in caplog.records if r.name == "gg"]
    assert len(records) == 1, [r.getMessage() for r in records]
    msg = records[0].getMessage()
    assert "CUDA_ERROR_NO_DEVICE" in msg and "CPU" in msg
    assert records[0].levelno == logging.INFO  # computing on the CPU without a GPU is normal


@pytest.mark.skipif(base.available("cuda"), reason="this machine has a GPU")
def test_no_gpu_for_real_one_line_on_stderr():
    code = ("import numpy as np, gg\n"
            "for _ in range(3):\n"
            "    x = gg.tensor(np.ones((2, 8), np.float32))\n"
            "    g = gg.build_forward(gg.soft_max(x)); g.compute()\n"
            "    assert g.plan.steps[0].backend == 'cpu'\n"
            "    assert np.allclose(g.plan.outputs[0].numpy(), 1 / 8)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ""  # logged at INFO: a GPU-less machine is quiet


def test_explicit_cpu_backend_logs_nothing(rng, monkeypatch, caplog):
    monkeypatch.setattr(base, "_fallback_logged", False)
    caplog.set_level(logging.DEBUG, logger="gg")
    g, y, _ = small_graph(CPU, f32(rng, 2, 8))
    g.compute()
    assert not [r for r in caplog.records if r.name == "gg"]


# ---- tensors of freed or foreign contexts -------------------------------------------------------
def test_freed_context_tensor_mixed_with_a_live_one(rng):
    dead, live = gg.Context(), gg.Context()
    a = dead.tensor(f32(rng, 8))
    b = live.tensor(f32(rng, 8))
    dead.free()
    y = gg.add(b, a)  # building is lazy and fine ...
    g = gg.build_forward(y, backends=CPU)
    for _ in range(2):  # ... computing is a GraphError naming the freed context, every time
        with pytest.raises(gg.GraphError, match="freed"):
            g.compute()
    assert b.numpy().shape == (8,)  # the live context is untouched


def test_reading_or_setting_a_tensor_of_a_freed_context(rng):
    ctx = gg.Context()
    t = ctx.tensor(f32(rng, 4), name="t")
    ctx.free()
    with pytest.raises(gg.GraphError, match="'t' belongs to a freed context"):
        t.numpy()
    with pytest.raises(gg.GraphError, match="'t' belongs to a freed context"):
        t.set(np.zeros(4, np.float32))
    with pytest.raises(gg.GGError, match="freed"):
        ctx.new_tensor(gg.F32, (4,))


def test_reading_an_op_tensor_before_any_compute(rng):
    y = gg.silu(gg.tensor(f32(rng, 4)))
    y.name = "y"
    with pytest.raises(gg.GraphError, match="'y' is an intermediate"):
        y.numpy()


@pytest.mark.skipif(base.available("cuda"), reason="this machine has a GPU")
def test_tensor_pinned_to_cuda_without_a_gpu(rng):
    ctx = gg.Context(backend="cuda")
    x = ctx.tensor(f32(rng, 4))
    g = gg.build_forward(gg.silu(x), backends=CPU)
    assert g.plan.steps[0].kernel == "transfer_cuda_to_cpu"  # planning works anywhere
    for _ in range(2):
        with pytest.raises(gg.BackendError, match="cuda.*not available"):
            g.compute()
    np.testing.assert_array_equal(x.numpy(), x.numpy())  # still readable on the host


@cuda
def test_tensors_pinned_to_other_backends_are_transferred(rng):
    data = f32(rng, 3, 40)
    on_gpu, on_cpu = gg.Context(backend="cuda"), gg.Context(backend="cpu")
    xg, wc = on_gpu.tensor(data), on_cpu.tensor(data[0])
    ycpu = gg.mul(gg.silu(xg), wc)                   # CPU plan reading a GPU-pinned leaf
    g1 = gg.build_forward(ycpu, backends=CPU)
    g1.compute()
    ygpu = gg.mul(gg.silu(xg), wc)                   # CUDA plan reading a CPU-pinned leaf
    g2 = gg.build_forward(ygpu, backends=CUDA)
    g2.compute()
    assert any(s.kernel == "transfer_cuda_to_cpu" for s in g1.plan.steps)
    assert any(s.kernel == "transfer_cpu_to_cuda" for s in g2.plan.steps)
    x64 = data.astype(np.float64)
    ref = x64 / (1 + np.exp(-x64)) * x64[0]
    assert nmse(ycpu.numpy(), ref) <= 1e-7 and nmse(ygpu.numpy(), ref) <= 1e-7


# ---- compute after a failed compute -------------------------------------------------------------
def test_compute_after_an_out_of_range_index(rng):
    ctx = gg.Context()
    a = f32(rng, 5, 16)
    idx = ctx.tensor(np.array([0, 7], np.int32))
    y = gg.scale(gg.get_rows(ctx.tensor(a), idx), 2.0)
    g = gg.build_forward(y, backends=CPU)
    with pytest.raises(gg.BackendError, match="range"):
        g.compute()
    idx.set(np.array([4, 1], np.int32))
    g.compute()
    np.testing.assert_allclose(y.numpy(), 2 * a[[4, 1]], rtol=1e-6)


def test_compute_after_a_bind_that_failed_half_way(rng, monkeypatch):
    """A failure while preparing (e.g. a kernel that does not compile) leaves nothing half-bound:
    the next compute binds again instead of running the segments prepared so far."""
    import fake_backend  # noqa: F401  (a second backend: the plan has two segments)
    data = f32(rng, 4, 64)
    ctx = gg.Context()
    x = ctx.tensor(data)
    y = gg.rope(gg.reshape(gg.silu(x), 16, 4, 4), ctx.tensor(np.arange(4, dtype=np.int32)), 16)
    g = gg.build_forward(y, backends=("fake", "cpu"))
    assert [s.backend for s in g.plan.steps if not s.inserted] == ["fake", "cpu"]
    cpu = base.get("cpu")
    with monkeypatch.context() as m:
        m.setattr(cpu, "prepare", raises(gg.CompileError("planted: no kernel")))
        with pytest.raises(gg.CompileError, match="planted"):
            g.compute()
    g.compute()
    ref = gg.build_forward(gg.rope(gg.reshape(gg.silu(gg.tensor(data)), 16, 4, 4),
                                   gg.tensor(np.arange(4, dtype=np.int32)), 16), backends=CPU)
    ref.compute()
    assert nmse(y.numpy(), ref.plan.outputs[0].numpy()) <= 1e-7


def test_compute_after_a_kernel_raised_mid_plan(rng, monkeypatch):
    ctx = gg.Context()
    data = f32(rng, 3, 30)
    y = gg.scale(gg.silu(gg.rms_norm(ctx.tensor(data), 1e-6)), 3.0)
    g = gg.build_forward(y, backends=CPU, fuse=False)
    g.compute()
    want = y.numpy()
    with monkeypatch.context() as m:
        m.setitem(cpu_kernels.KERNELS, "silu", raises(gg.BackendError("planted")))
        with pytest.raises(gg.BackendError, match="planted"):
            g.compute()
    g.compute()
    np.testing.assert_array_equal(y.numpy(), want)


@cuda
def test_cuda_compute_after_a_freed_input_then_a_rebuilt_graph(rng):
    data = f32(rng, 3, 64)
    ctx = gg.Context()
    g = gg.build_forward(gg.silu(ctx.tensor(data)), backends=CUDA)
    g.compute()
    ctx.free()
    for _ in range(2):
        with pytest.raises(gg.GraphError, match="freed"):
            g.compute()
    g2, y, ref = small_graph(CUDA, data)
    g2.compute()
    assert nmse(y.numpy(), ref) <= 1e-6


# ---- two threads --------------------------------------------------------------------------------
def _threads(backends, rng, same_graph=False, rounds=20, rows=64, ne0=2049):
    """Two threads computing `rounds` times each, every result checked against float64.
    Two graphs: each thread has its own graph and inputs (set between computes), and both read a
    shared weight. One graph: both threads compute the very same graph (fixed input) at once."""
    w = f32(rng, ne0)
    shared = gg.Context().tensor(w)
    datas = [[f32(rng, rows, ne0) for _ in range(rounds)] for _ in range(2)]
    if same_graph:
        datas[1] = datas[0] = [datas[0][0]] * rounds
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def build():
        ctx = gg.Context()
        x = ctx.tensor(datas[0][0])
        y = gg.soft_max_ext(gg.scale(gg.mul(gg.rms_norm(x, 1e-6), shared), 2.0), scale=0.125)
        return x, y, gg.build_forward(y, backends=backends)
    common = build() if same_graph else None

    def ref(d):
        d64 = d.astype(np.float64)
        r = d64 / np.sqrt((d64 ** 2).mean(-1, keepdims=True) + 1e-6) * w * 0.25
        e = np.exp(r - r.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def work(k):
        try:
            x, y, g = common if same_graph else build()
            start.wait()
            for d in datas[k]:
                if not same_graph:
                    x.set(d)
                g.compute()
                err = nmse(y.numpy(), ref(d))
                assert err <= 1e-6, f"thread {k}: NMSE {err}"
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a compute thread hung"
    assert not errors, errors


def test_two_threads_two_graphs_cpu(rng):
    _threads(CPU, rng)


def test_two_threads_one_graph_cpu(rng):
    _threads(CPU, rng, same_graph=True)


@cuda
def test_two_threads_two_graphs_cuda(rng):
    _threads(CUDA, rng)


@cuda
def test_two_threads_one_graph_cuda(rng):
    _threads(CUDA, rng, same_graph=True)


@cuda
def test_cuda_from_a_fresh_thread(rng):
    """The driver context is per thread: a thread that never touched CUDA can allocate, compute
    and read (gg makes its context current there)."""
    data = f32(rng, 2, 100)
    out: dict = {}

    def work():
        try:
            g, y, ref = small_graph(CUDA, data)
            g.compute()
            out["err"] = nmse(y.numpy(), ref)
        except BaseException as e:  # noqa: BLE001
            out["exc"] = e
    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=300)
    assert "exc" not in out, out.get("exc")
    assert out["err"] <= 1e-6
