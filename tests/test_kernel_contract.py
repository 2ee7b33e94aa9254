"""The Python <-> CUDA argument contract: every kernel a family chooses exists in the compiled
catalog, and the arguments its lowering packs match the `extern "C"` signature parameter by
parameter (sizes from the CUBIN's ELF, no GPU needed; on a GPU also from cuFuncGetParamInfo).

The lowering runs here against a fake runtime and fake memory (NVRTC compiles for real), over
plans that reach every family and most variants: the ops one by one in each dtype, the fused
chains, the llama block's decode and prefill plans."""
from __future__ import annotations


import numpy as np
import pytest

import gg
from gg import llama as L
from gg.backends.cuda import catalog, compiler, cubin, families, launch

pytestmark = pytest.mark.compile_all
ARCH = "sm_90"


class _FakeBuffer:
    backend = "cuda"
    ptr = 1 << 32  # 256-aligned, like every buffer gg allocates

    def write(self, offset, data):
        pass


class _FakeMemory:
    def locate(self, t):
        return _FakeBuffer(), 0

    def workspace(self, step, kind):
        return _FakeBuffer(), 0


class _FakeRuntime:
    """What lowering asks of a runtime, answered without a device: `function` compiles with NVRTC
    and records the signature the CUBIN declares."""

    err_word = _FakeBuffer()
    sm_count, l2_bytes, cc, stream, stream_handle = 132, 50 << 20, (8, 0), 0, 0

    def __init__(self):
        self.err_names: dict[int, str] = {}
        self.signatures: dict[tuple[str, str], tuple[int, ...]] = {}

    def function(self, file, name):
        info = _kernels(file).get(name)
        assert info is not None, f"{name} is not a kernel of {file}"
        self.signatures[(file, name)] = info.params
        return name

    def max_threads(self, file, name):
        return 1024

    def set_max_dynamic_smem(self, fn, nbytes, name):
        pass

    def alloc(self, nbytes):
        return _FakeBuffer()


_cache: dict[str, dict] = {}


def _kernels(file: str) -> dict:
    if file not in _cache:
        _cache[file] = cubin.kernels(compiler.compile_file(file, ARCH))
    return _cache[file]


def mismatch(rt: _FakeRuntime, record) -> str | None:
    """Why a launch record's packed arguments do not fit its kernel's signature (None: they do)."""
    sizes = tuple(v.nbytes for v in record.args._vals)
    want = rt.signatures[(record.file, record.name)]
    if sizes != want:
        return f"{record.name}: packed {len(sizes)} arguments {sizes}, the kernel takes {len(want)}: {want}"
    return None


def _lowered(graphs) -> tuple[_FakeRuntime, list]:
    rt, records = _FakeRuntime(), []
    real_init = launch.Launch.__init__

    def init(self, rt_, file, name, *args, **kwargs):
        real_init(self, rt_, file, name, *args, **kwargs)
        self.file = file
        records.append(self)
    launch.Launch.__init__ = init
    try:
        for g in graphs:  # bound with its steps: a lowering may ask for its neighbours (launch.following)
            with launch.bound(_FakeMemory(), g.plan.steps):
                for i, step in enumerate(g.plan.steps):
                    if step.backend == "cuda":
                        families.lower(rt, step, i)
    finally:
        launch.Launch.__init__ = real_init
    return rt, records


def _graphs() -> list:
    rng = np.random.default_rng(0)
    ctx = gg.Context()
    out = []

    def plan(*ts):
        out.append(gg.build_forward(*ts, backends=("cuda",)))

    for dt in (np.float32, np.float16):
        a = ctx.tensor(rng.standard_normal((3, 64)).astype(dt))
        b = ctx.tensor(rng.standard_normal((1, 64)).astype(np.float32))
        for op in (gg.add, gg.sub, gg.mul, gg.div):
            plan(op(a, a))
        for make in (lambda t: gg.scale(t, 0.5), gg.silu, gg.gelu, lambda t: gg.diag_mask_inf(t, 1),
                     lambda t: gg.rms_norm(t, 1e-6), lambda t: gg.norm(t, 1e-5), gg.cont):
            plan(make(a))
        plan(gg.rms_norm(gg.tensor(rng.standard_normal((3, 6000)).astype(dt)), 1e-6))  # the general build
        plan(gg.get_rows(a, ctx.tensor(np.array([2, 0], np.int32))))
        plan(gg.cpy(gg.transpose(a), ctx.new_tensor(gg.F16, (3, 64))))
        plan(gg.mul(gg.rms_norm(b, 1e-6), b))
    x = ctx.tensor(rng.standard_normal((4, 2, 64)).astype(np.float32))
    plan(gg.rope(x, ctx.tensor(np.arange(4, dtype=np.int32)), 64))
    for n in (100, 5000, 20000):  # register builds and the shared-memory kernel
        s = ctx.tensor(rng.standard_normal((2, n)).astype(np.float32))
        plan(gg.soft_max_ext(s, ctx.tensor(rng.standard_normal((2, n)).astype(np.float16)), 0.5))
        plan(gg.soft_max(gg.diag_mask_inf(gg.scale(s, 0.5), 0)))
    cache = ctx.new_tensor(gg.F16, (64, 16))
    plan(gg.set_rows(cache, ctx.tensor(rng.standard_normal((2, 64)).astype(np.float32)),
                     ctx.tensor(np.array([3, 9], np.int32))))
    for K, T in ((4096, 1), (4096, 3), (520, 1), (64, 40)):  # wide, several columns, short rows, tiled
        w = ctx.tensor(rng.standard_normal((96, K)).astype(np.float16))
        v = ctx.tensor(rng.standard_normal((T, K)).astype(np.float32))
        plan(gg.mul_mat(w, v))
        if T <= 8:
            plan(gg.add(gg.mul_mat(w, v), ctx.tensor(rng.standard_normal((T, 96)).astype(np.float32))))
    plan(gg.argmax(ctx.tensor(rng.standard_normal((2, 1000)).astype(np.float32))))
    plan(gg.argmax(ctx.tensor(rng.standard_normal((1, 49152)).astype(np.float32))))  # argmax_cl_vec
    from test_quant_ops import random_weights
    for dt in (gg.Q8_0, gg.Q4_K):  # blocks read in place (1 and 3 columns), dequantized for a GEMM, gathered
        wq = random_weights(rng, dt, 64, 512, ctx)
        for T in (1, 3, 20):
            plan(gg.mul_mat(wq, ctx.tensor(rng.standard_normal((T, 512)).astype(np.float32))))
        plan(gg.get_rows(wq, ctx.tensor(np.array([5, 1], np.int32))))
    for n_head_kv, T in ((8, 1), (32, 4), (32, 16)):  # the llama block: epilogue, flash, prefill
        cfg = L.Config(n_embd=4096, n_head=32, n_head_kv=n_head_kv, n_ff=64, n_layer=1, n_ctx=64)
        w = L.Weights.random(cfg, gg.Context(), seed=1)
        cache = L.KVCache(cfg, gg.Context())
        batch = L.Batch.indexed(cfg, gg.Context(), T) if T == 1 else L.Batch.fixed(cfg, gg.Context(), T, 3)
        out.append(L.build_forward_pass(cfg, w, cache, batch, backends=("cuda",))[0])
    return out


def test_every_choice_is_in_the_catalog_and_fits_its_signature(monkeypatch):
    from gg.backends.cuda.families import matmul
    monkeypatch.setattr(matmul, "have_cublas", lambda: False)  # cuBLAS calls have no kernel of ours
    graphs = _graphs()
    catalog_names = {(v.file, v.name) for v in catalog.variants()}
    chosen = {run for g in graphs for s in g.plan.steps for run in s.choice.runs()}
    assert chosen <= catalog_names, chosen - catalog_names
    rt, records = _lowered(graphs)
    assert len({r.name for r in records}) >= 25  # the graphs reach most families' variants
    problems = [m for r in records if (m := mismatch(rt, r))]
    assert not problems, "\n".join(problems)
    files = {r.file for r in records}
    assert files >= {"binary.cu", "unary.cu", "norm.cu", "softmax.cu", "rope.cu", "rows.cu", "cpy.cu",
                     "mul_mat.cu", "attn.cu", "quant.cu", "reduce.cu"}


def test_a_planted_mismatch_is_caught(monkeypatch):
    """The check can fail: a lowering that packs one argument too many, or one of the wrong width."""
    x = gg.tensor(np.ones((2, 64), np.float32))
    g = gg.build_forward(gg.scale(x, 2.0), backends=("cuda",))
    from gg.backends.cuda.families import elementwise
    real = elementwise.Args

    class Extra(real):
        def i32(self, v):
            super().i32(v)
            if v == 0:  # the n_past slot: also pack a stray int
                super().i32(7)
            return self
    monkeypatch.setattr(elementwise, "Args", Extra)
    rt, records = _lowered([g])
    assert "packed 8 arguments" in mismatch(rt, records[0])

    class Wide(real):
        def f32(self, v):
            return self.f64(v)  # a double where the kernel takes a float
    monkeypatch.setattr(elementwise, "Args", Wide)
    rt, records = _lowered([g])
    assert mismatch(rt, records[0]) is not None


def test_every_catalog_variant_has_a_signature():
    for v in catalog.variants():
        info = _kernels(v.file).get(v.name)
        assert info is not None and info.params and info.code_bytes > 0, v


@pytest.mark.cuda
def test_signatures_agree_with_the_driver():
    """On a GPU: cuFuncGetParamInfo (CUDA 12.4+) gives the same parameter sizes as the ELF."""
    from gg.backends.cuda import runtime
    from gg.backends.cuda.driver import cu
    if not hasattr(cu, "cuFuncGetParamInfo"):
        pytest.skip("this cuda-python has no cuFuncGetParamInfo")
    rt = runtime.get()
    for v in catalog.variants():
        fn = rt.function(v.file, v.name)
        sizes = []
        while True:
            err, _, size = cu.cuFuncGetParamInfo(fn, len(sizes))
            if int(err) != 0:
                break
            sizes.append(int(size))
        assert tuple(sizes) == _kernels(v.file)[v.name].params, v


@pytest.mark.parametrize("file, family, define, value", [("attn.cu", "attention", "FA_STAMPS", 1),
                                                          ("quant.cu", "blocks", "QUANT_STAMP_GRID", 64)])
def test_measuring_builds_compile_with_the_same_kernels(file, family, define, value, monkeypatch):
    """The clock-stamp builds (scripts/stamps.py; kernels/common.cuh gg_stamp) keep compiling, with
    every kernel and signature of the default build: they only add stamps."""
    plain = cubin.kernels(compiler.compile_file(file, ARCH))
    monkeypatch.setitem(getattr(families, family).DEFINES[file], define, value)
    stamped = cubin.kernels(compiler.compile_file(file, ARCH))
    assert {n: k.params for n, k in stamped.items()} == {n: k.params for n, k in plain.items()}
