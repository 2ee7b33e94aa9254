"""Sibling mat-vecs (gg/graph/siblings.py, CUDA families/siblings.py + kernels/siblings.cu): the
one-column products of the same input become one step, with the rms_norm -> mul that makes the
input (prologue) and the SwiGLU `act(Wg·h) * (Wu·h)` (epilogue) where legal.

Plans need no GPU. Values are checked on a CPU backend that declares siblings (the planner's
legality and the exported values' memory, on any machine) and on the GPU, against float64
references and against the unfused plan."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends import base
from gg.backends.cpu import CPUBackend
from gg.backends.cuda.families import siblings as family
from gg.buffer import HostBuffer
from reference import NMSE_MUL_MAT, ref_gelu, ref_mul_mat, ref_rms_norm, ref_silu
from gg.backends.cuda.families import blocks
from reference_helpers import nmse, nmse_fused_vs_plain, nmse_vs_reference

cuda = pytest.mark.cuda
CUDA = ("cuda", "cpu")
EPS = 1e-5


# ---- a CPU backend that declares siblings (runs the group's ops one after another) ---------------
class SibBuffer(HostBuffer):
    backend = "sibcpu"


class SibCPU(CPUBackend):
    name = "sibcpu"

    def patterns(self):
        return self.PATTERNS._replace(siblings=4)

    def supports(self, ops, nodes):
        return super().supports(ops, nodes) or family.claims(tuple(ops))

    def alloc(self, nbytes):
        return SibBuffer(nbytes)


BACKEND = SibCPU()
base.register("sibcpu", __name__)


# ---- graphs ---------------------------------------------------------------------------------------
def rand(rng, *shape):
    return (rng.standard_normal(shape) * 0.5 + 0.05).astype(np.float32)


class Qkv:
    """q, k, v = Wq·h, Wk·h, Wv·h with h = rms_norm(x) * w of one token (llama.cpp's form: q and
    k each roped right after its product, so the rope of q lies between the products)."""

    def __init__(self, rng, K=2056, rows=(1023, 257, 257), wdt=np.float16, norm=True, rope=True, cols=1):
        ctx = gg.Context()
        self.x, self.w = rand(rng, cols, K) * 3, rand(rng, K)
        self.W = [rand(rng, m, K) for m in rows]
        self.wdt = wdt
        xt = ctx.tensor(self.x)
        self.h = gg.mul(gg.rms_norm(xt, EPS), ctx.tensor(self.w)) if norm else xt
        self.norm = norm
        self.Wt = [ctx.tensor(W, dtype=wdt) if wdt is gg.BF16 else ctx.tensor(W.astype(wdt)) for W in self.W]
        self.prods = []
        self.outs = []
        pos = ctx.tensor(np.array([7] * cols, np.int32))
        for i, W in enumerate(self.Wt):
            p = gg.mul_mat(W, self.h)
            self.prods.append(p)
            if rope and i < 2 and rows[i] % 8 == 0:
                p = gg.rope(gg.reshape(p, 8, rows[i] // 8, cols), pos, 8, mode=gg.ROPE_NEOX)
            self.outs.append(p)

    def refs(self):
        h = ref_rms_norm(self.x.astype(np.float64), EPS) * self.w if self.norm else self.x.astype(np.float64)
        return [ref_mul_mat(W.numpy().astype(np.float64), h) for W in self.Wt]  # the stored weights


def swiglu(rng, K=2056, M=1029, act="silu", order="act_first", wdt=np.float16, norm=True):
    ctx = gg.Context()
    x, w = rand(rng, 1, K) * 3, rand(rng, K)
    Wg, Wu = rand(rng, M, K), rand(rng, M, K)
    xt = ctx.tensor(x)
    h = gg.mul(gg.rms_norm(xt, EPS), ctx.tensor(w)) if norm else xt
    g = getattr(gg, act)(gg.mul_mat(ctx.tensor(Wg.astype(wdt)), h))
    u = gg.mul_mat(ctx.tensor(Wu.astype(wdt)), h)
    y = gg.mul(g, u) if order == "act_first" else gg.mul(u, g)
    hr = ref_rms_norm(x.astype(np.float64), EPS) * w if norm else x.astype(np.float64)
    f = ref_silu if act == "silu" else ref_gelu
    ref = f(ref_mul_mat(Wg.astype(wdt).astype(np.float64), hr)) * ref_mul_mat(Wu.astype(wdt).astype(np.float64), hr)
    return y, ref


def sibling_steps(plan):
    return [s for s in plan.steps if s.ops.count("mul_mat") >= 2]


# ---- plans (no GPU) -------------------------------------------------------------------------------
def test_qkv_of_one_normalized_row_is_one_step(rng, monkeypatch):
    monkeypatch.setattr(family, "EPILOGUE_OPS", ())  # the ropes as steps (their epilogue: test_sibling_epilogue.py)
    t = Qkv(rng, K=4096, rows=(4096, 1024, 1024))
    plan = gg.build_forward(*t.outs, backends=CUDA).plan
    (s,) = sibling_steps(plan)
    assert s.ops == ("rms_norm", "mul") + ("mul_mat",) * 3 and s.kernel == "mul_mat_sib_norm_f16_f32"
    assert plan.steps[0] is s  # the norm is no step of its own, and the merged step runs first
    assert s.exports == tuple(t.prods[:2]) and s.out is t.prods[2]
    offs = {plan.alloc.offsets[p] for p in t.prods}
    assert len(offs) == 3  # every product keeps its own memory
    assert sum(1 for st in plan.steps if "mul_mat" in st.ops) == 1
    assert "and mul_mat" in str(plan)


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("order", ["act_first", "act_second"])
def test_gate_up_and_swiglu_are_one_step(rng, act, order):
    y, _ = swiglu(rng, act=act, order=order)
    plan = gg.build_forward(y, backends=CUDA).plan
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul", "mul_mat", "mul_mat", act, "mul")]
    s = plan.steps[0]
    assert s.kernel == f"mul_mat_sib_norm_{act}_f16_f32" and s.exports == ()
    assert set(plan.alloc.offsets) == {y}  # the two products are never stored


def test_without_norm_and_f32_weights(rng):
    t = Qkv(rng, rows=(100, 36, 36), wdt=np.float32, norm=False, rope=False)
    (s,) = gg.build_forward(*t.outs, backends=CUDA).plan.steps
    assert s.ops == ("mul_mat",) * 3 and s.kernel == "mul_mat_sib_f32_f32"


def test_norm_with_another_reader_stays_a_step(rng):
    t = Qkv(rng, rope=False)
    plan = gg.build_forward(*t.outs, t.h, backends=CUDA).plan
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul"), ("mul_mat",) * 3]


def test_swiglu_product_read_elsewhere_keeps_the_products(rng):
    y, _ = swiglu(rng)
    gate = y.src[0].src[0]
    plan = gg.build_forward(y, gate, backends=CUDA).plan
    ops = [s.ops for s in plan.steps]
    assert ("rms_norm", "mul", "mul_mat", "mul_mat") in ops and ("silu",) in ops and ("mul",) in ops


def test_prefill_is_not_merged(rng):
    t = Qkv(rng, cols=3, rope=False)
    plan = gg.build_forward(*t.outs, backends=CUDA).plan
    assert not sibling_steps(plan)


def test_different_inputs_are_not_merged(rng):
    ctx = gg.Context()
    W1, W2 = (ctx.tensor(rand(rng, 64, 2048).astype(np.float16)) for _ in range(2))
    h1, h2 = (ctx.tensor(rand(rng, 1, 2048)) for _ in range(2))
    plan = gg.build_forward(gg.mul_mat(W1, h1), gg.mul_mat(W2, h2), backends=CUDA).plan
    assert not sibling_steps(plan)


def _dependent(rng, how):
    """p1 = W1·h and p2 = W2'·h where W2' needs p1 (directly, or through a step between)."""
    ctx = gg.Context()
    K = 2048
    h = ctx.tensor(rand(rng, 1, K))
    p1 = gg.mul_mat(ctx.tensor(rand(rng, K, K)), h)             # ne (K, 1): one more row of weights
    if how == "direct":
        p2 = gg.mul_mat(p1, h)                                      # p1 is p2's weight row
    else:
        p2 = gg.mul_mat(gg.mul(ctx.tensor(rand(rng, 8, K)), p1), h)  # through a mul step
    return p1, p2


@pytest.mark.parametrize("how", ["direct", "through a step"])
def test_a_sibling_reading_another_is_not_merged(rng, how):
    p1, p2 = _dependent(rng, how)
    plan = gg.build_forward(p1, p2, backends=CUDA).plan
    assert not sibling_steps(plan)


@pytest.mark.parametrize("into", ["W2", "another tensor"])
def test_a_write_in_between(rng, into):
    ctx = gg.Context()
    K = 2048
    h = ctx.tensor(rand(rng, 1, K))
    W1 = ctx.tensor(rand(rng, 64, K))
    W2 = ctx.new_tensor(gg.F32, (K, 40), persistent=True)
    other = ctx.new_tensor(gg.F32, (K, 40), persistent=True)
    p1 = gg.mul_mat(W1, h)
    dst = W2 if into == "W2" else other
    write = gg.cpy(gg.scale(h, 2.0), gg.view_1d(dst, K, 5 * K * 4))
    p2 = gg.mul_mat(W2, h)
    g = gg.build_forward(p1, backends=CUDA)
    g.build_forward_expand(write)
    g.build_forward_expand(p2)
    merged = sibling_steps(g.plan)
    assert bool(merged) == (into != "W2")


def test_llama_decode_ffn_is_one_step():
    """gg.llama's FFN writes gate and up as two products: with siblings, the norm, both products
    and silu(g) * u are one step; the attention's stacked QKV product keeps its epilogue."""
    from gg import llama as L
    cfg = L.Config(n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_layer=1, n_ctx=24)
    ctx = gg.Context()
    graph, _, _ = L.build_forward_pass(cfg, L.Weights.random(cfg, ctx), L.KVCache(cfg, ctx),
                                       L.Batch.indexed(cfg, ctx, 1), backends=CUDA)
    steps = graph.plan.steps
    assert steps[0].kernel == "mul_mat_vecw_norm_epi_f16_f32"
    assert [s.ops for s in steps if "silu" in s.ops] == [("rms_norm", "mul", "mul_mat", "mul_mat", "silu", "mul")]
    assert len(steps) == 5


# ---- values on the CPU (a backend that declares siblings) -----------------------------------------
def _compute(outs, backends, fuse=True, expand=()):
    g = gg.build_forward(*outs, backends=backends, fuse=fuse)
    for t in expand:
        g.build_forward_expand(t)
    g.compute()
    return g, [o.numpy() for o in outs]


@pytest.mark.parametrize("wdt", [np.float32, np.float16])
def test_cpu_siblings_equal_unfused_and_reference(rng, wdt):
    t = Qkv(rng, wdt=wdt)
    g, fused = _compute(t.prods + t.outs[:2], ("sibcpu",))
    assert len(sibling_steps(g.plan)) == 1
    _, plain = _compute(t.prods + t.outs[:2], ("sibcpu",), fuse=False)
    for f, p in zip(fused, plain):
        np.testing.assert_array_equal(f, p)
    for f, r in zip(fused, t.refs()):
        assert nmse(f, r.reshape(f.shape)) <= 1e-10


@pytest.mark.parametrize("order", ["act_first", "act_second"])
def test_cpu_swiglu_equals_unfused(rng, order):
    y, ref = swiglu(rng, act="gelu", order=order)
    g, (fused,) = _compute([y], ("sibcpu",))
    assert g.plan.steps[0].ops[-2:] == ("gelu", "mul")
    _, (plain,) = _compute([y], ("sibcpu",), fuse=False)
    np.testing.assert_array_equal(fused, plain)
    assert nmse(fused, ref.reshape(fused.shape)) <= 1e-10


def test_cpu_write_into_the_weights_between_is_seen(rng):
    """A product built after a write into its weights reads the written row (not merged)."""
    ctx = gg.Context()
    K = 64 * 8
    x = rand(rng, 1, K)
    h = ctx.tensor(x)
    W1 = rand(rng, 16, K)
    W2 = ctx.new_tensor(gg.F32, (K, 8), persistent=True)
    w2 = rand(rng, 8, K)
    W2.set(w2)
    p1 = gg.mul_mat(ctx.tensor(W1), h)
    write = gg.cpy(gg.scale(h, 2.0), gg.view_1d(W2, K, 5 * K * 4))
    p2 = gg.mul_mat(W2, h)
    g = gg.build_forward(p1, backends=("sibcpu",))
    g.build_forward_expand(write)
    g.build_forward_expand(p2)
    g.compute()
    w2[5] = 2 * x[0]
    assert nmse(p2.numpy(), ref_mul_mat(w2.astype(np.float64), x.astype(np.float64)).reshape(-1)) <= 1e-10
    assert not sibling_steps(g.plan)


# ---- the CUDA kernel ------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("wdt", [np.float16, np.float32, gg.BF16])
@pytest.mark.parametrize("shape", [(2056, (1023, 257, 257)), (4096, (4096, 1024, 1024)), (576, (576, 192, 192)),
                                   (1000, (5, 3))])
@pytest.mark.parametrize("norm", [True, False])
def test_cuda_siblings(rng, wdt, shape, norm):
    K, rows = shape
    t = Qkv(rng, K=K, rows=rows, wdt=wdt, norm=norm)
    g, fused = _compute(t.prods + t.outs[:2], CUDA)
    (s,) = sibling_steps(g.plan)
    assert s.backend == "cuda" and s.kernel.startswith("mul_mat_sib")
    _, plain = _compute(t.prods + t.outs[:2], CUDA, fuse=False)
    for f, p in zip(fused, plain):
        assert nmse(f, p) <= 1e-10
    for f, r in zip(fused, t.refs()):
        assert nmse(f, r.reshape(f.shape)) <= NMSE_MUL_MAT / 100


@cuda
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("order", ["act_first", "act_second"])
@pytest.mark.parametrize("wdt,K,M,norm", [(np.float16, 2056, 1029, True), (np.float32, 4096, 14, False),
                                          (np.float16, 576, 1536, True)])
def test_cuda_swiglu(rng, act, order, wdt, K, M, norm):
    y, ref = swiglu(rng, K=K, M=M, act=act, order=order, wdt=wdt, norm=norm)
    g, (fused,) = _compute([y], CUDA)
    assert g.plan.steps[-1].ops[-2:] == (act, "mul") and len(g.plan.steps) == 1
    _, (plain,) = _compute([y], CUDA, fuse=False)
    assert nmse(fused, plain) <= 1e-10
    assert nmse(fused, ref.reshape(fused.shape)) <= NMSE_MUL_MAT / 100


@cuda
def test_cuda_write_in_between_and_replay(rng):
    """The products read the weights the write left, on every compute (the graph is replayed)."""
    ctx = gg.Context()
    K = 2048
    x = rand(rng, 1, K)
    h = ctx.tensor(x)
    W1 = rand(rng, 64, K)
    W2 = ctx.new_tensor(gg.F16, (K, 8), persistent=True)
    w2 = rand(rng, 8, K).astype(np.float16).astype(np.float32)
    W2.set(w2.astype(np.float16))
    p1 = gg.mul_mat(ctx.tensor(W1.astype(np.float16)), h)
    write = gg.cpy(gg.scale(h, 2.0), gg.view_1d(W2, K, 5 * K * 2))
    p2 = gg.mul_mat(W2, h)
    g = gg.build_forward(p1, backends=CUDA)
    g.build_forward_expand(write)
    g.build_forward_expand(p2)
    for _ in range(2):
        g.compute()
    w2[5] = (2 * x[0]).astype(np.float16)
    assert nmse(p2.numpy(), ref_mul_mat(w2.astype(np.float64), x.astype(np.float64)).reshape(-1)) <= 1e-6


# ---- block-quantized weights (kernels/quant.cu mul_mat_sibq_*) ------------------------------------
QTYPES = [gg.Q8_0, gg.Q4_0, gg.Q4_1, gg.Q4_K, gg.Q6_K]


def quant_siblings(rng, dts, K, rows, norm=True, act=""):
    """Products of one token with quantized weights of types `dts` (one per product): (outputs,
    float64 references over the dequantized weights). act: silu/gelu of the first times the second."""
    from test_quant_ops import random_weights
    ctx = gg.Context()
    x, w = rand(rng, 1, K) * 3, rand(rng, K)
    xt = ctx.tensor(x)
    h = gg.mul(gg.rms_norm(xt, EPS), ctx.tensor(w)) if norm else xt
    Ws = [random_weights(rng, dt, m, K, ctx) for dt, m in zip(dts, rows)]
    prods = [gg.mul_mat(W, h) for W in Ws]
    hr = ref_rms_norm(x.astype(np.float64), EPS) * w if norm else x.astype(np.float64)
    refs = [ref_mul_mat(W.numpy().astype(np.float64), hr) for W in Ws]
    if not act:
        return prods, refs
    f = ref_silu if act == "silu" else ref_gelu
    return [gg.mul(getattr(gg, act)(prods[0]), prods[1])], [f(refs[0]) * refs[1]]


def sibq_symbol(weights, norm: bool, act: str = "") -> str:
    """The mul_mat_sibq_* build of sibling products of `weights` (its _small one for small QX
    matrices, blocks.small_siblings)."""
    from gg.backends.cuda.families import blocks
    dt = weights[0].dtype
    small = "_small" if blocks.small_siblings(list(weights)) else ""
    return f"mul_mat_sibq{'_norm' if norm else ''}{'_' + act if act else ''}_{dt.name}_f32{blocks.qx(dt)}{small}"


def act_symbol(out, act: str, norm: bool) -> str:
    """The kernel of the SwiGLU / GeGLU sibling step making `out` (act(Wg h) * (Wu h)): the
    streaming build for the types it has (with or without the norm), else mul_mat_sibq_*."""
    from gg.backends.cuda.families import blocks
    gate = out.src[0].src[0].src[0]
    if blocks.streams(gate) and (blocks.STREAM_NORM or not norm):
        return blocks.sibs_symbol(gate, act, norm)
    return sibq_symbol([gate, out.src[1].src[0]], norm, act)


@pytest.mark.parametrize("dt", QTYPES)
def test_quant_qkv_with_norm_is_one_step(rng, dt):
    outs, _ = quant_siblings(rng, [dt] * 3, 4096, (4096, 1024, 1024))
    plan = gg.build_forward(*outs, backends=CUDA).plan
    (s,) = plan.steps
    assert s.ops == ("rms_norm", "mul") + ("mul_mat",) * 3 and s.kernel == sibq_symbol([o.src[0] for o in outs], True)
    assert s.choice.quant and s.choice.file == "quant.cu"
    assert s.exports == tuple(outs[:2]) and s.out is outs[2]
    assert len({plan.alloc.offsets[p] for p in outs}) == 3


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_quant_gate_up_and_swiglu_are_one_step(rng, act):
    (y,), _ = quant_siblings(rng, [gg.Q4_K] * 2, 512, (1536, 1536), act=act)
    plan = gg.build_forward(y, backends=CUDA).plan
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul", "mul_mat", "mul_mat", act, "mul")]
    k = plan.steps[0].choice
    assert k.symbol == f"mul_mat_sibq_norm_{act}_q4_k_f32"
    # a block writes `per` outputs from per gate rows and per up rows: the mat-vec's rows per block
    assert k.per * 2 == family.blocks.matvec_rows(gg.Q4_K, 512, 1, sibling=True) and k.blocks == (-(-1536 // k.per),)


@pytest.mark.parametrize("dt,stream_norm", [(gg.Q8_0, True), (gg.Q4_0, False), (gg.Q4_0, True), (gg.Q4_1, True)])
def test_quant_big_ffn_norm(rng, dt, stream_norm, monkeypatch):
    """llama-8B's gate/up: the blocks would re-read the norm's weight for more bytes than the
    rms_norm step costs (family.QUANT_NORM_BYTES_MAX), so the norm stays a step of its own; the
    streaming build of Q4_0/Q4_1 takes it in (mul_mat_sibs<R>_norm_*) below that (an eighth of the
    rows here: mul_mat_sibq_norm_* too), unless blocks.STREAM_NORM is off."""
    monkeypatch.setattr(family.blocks, "STREAM_NORM", stream_norm)
    (y,), _ = quant_siblings(rng, [dt] * 2, 4096, (14336, 14336), act="silu")
    plan = gg.build_forward(y, backends=CUDA).plan
    assert [s.ops for s in plan.steps] == [("rms_norm", "mul"), ("mul_mat", "mul_mat", "silu", "mul")]
    assert plan.steps[1].kernel == act_symbol(y, "silu", norm=False)
    (y,), _ = quant_siblings(rng, [dt] * 2, 4096, (1792, 1792), act="silu")
    (step,) = gg.build_forward(y, backends=CUDA).plan.steps
    assert step.ops == ("rms_norm", "mul", "mul_mat", "mul_mat", "silu", "mul")
    if stream_norm and dt in family.blocks.STREAM_TYPES:
        assert step.kernel == act_symbol(y, "silu", norm=True) and step.kernel.startswith("mul_mat_sibs")
    else:
        assert step.kernel == act_symbol(y, "silu", norm=True) and step.kernel.startswith("mul_mat_sibq_norm_silu")


def test_quant_mixed_block_types_are_not_merged(rng):
    outs, _ = quant_siblings(rng, [gg.Q8_0, gg.Q4_0, gg.Q4_0], 4096, (512, 256, 256), norm=False)
    plan = gg.build_forward(*outs, backends=CUDA).plan
    assert [s.ops for s in plan.steps] == [("mul_mat",), ("mul_mat",) * 2]
    assert plan.steps[1].kernel == sibq_symbol([o.src[0] for o in outs[1:]], False)


def test_quant_and_float_weights_are_not_merged(rng):
    from test_quant_ops import random_weights
    ctx = gg.Context()
    h = ctx.tensor(rand(rng, 1, 1024))
    outs = [gg.mul_mat(random_weights(rng, gg.Q8_0, 64, 1024, ctx), h),
            gg.mul_mat(ctx.tensor(rand(rng, 64, 1024).astype(np.float16)), h)]
    assert not sibling_steps(gg.build_forward(*outs, backends=CUDA).plan)


@pytest.mark.parametrize("act", ["", "silu"])
def test_cpu_quant_siblings_equal_unfused_and_reference(rng, act):
    outs, refs = quant_siblings(rng, [gg.Q4_1] * (2 if act else 3), 1024, (129, 129) if act else (129, 33, 33),
                                act=act)
    g, fused = _compute(outs, ("sibcpu",))
    assert len(sibling_steps(g.plan)) == 1
    _, plain = _compute(outs, ("sibcpu",), fuse=False)
    for f, p, r in zip(fused, plain, refs):
        np.testing.assert_array_equal(f, p)
        assert nmse(f, r.reshape(f.shape)) <= 1e-6


# K = 4096 (two whole chunks of 2048), 2304 (a partial last chunk), 512 (four rows side by side);
# odd row counts, llama's GQA-sized q/k/v.
QSHAPES = [(4096, (4096, 1024, 1024)), (2304, (1029, 257, 131)), (512, (77, 13, 13, 5))]


@cuda
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape", QSHAPES)
@pytest.mark.parametrize("norm", [True, False])
def test_cuda_quant_siblings(rng, dt, shape, norm):
    K, rows = shape
    outs, refs = quant_siblings(rng, [dt] * len(rows), K, rows, norm=norm)
    g, fused = _compute(outs, CUDA)
    (s,) = g.plan.steps
    assert s.kernel == sibq_symbol([o.src[0] for o in outs], norm)
    gp, plain = _compute(outs, CUDA, fuse=False)
    for out, f, p, r in zip(outs, fused, plain, refs):
        if norm or blocks.streams(out.src[0]):  # apart, the product runs the streaming mat-vec
            assert nmse(f, p) <= nmse_fused_vs_plain(g, gp)
        else:  # the same mat-vec, block for block: the same sums in the same order
            np.testing.assert_array_equal(f, p)
        assert nmse(f, r.reshape(f.shape)) <= nmse_vs_reference(g)


@cuda
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("K,M,norm", [(4096, 1031, True), (2304, 77, False), (512, 45, True), (8448, 77, False), (8448, 77, True)])
@pytest.mark.parametrize("stream_norm", [False, True])
def test_cuda_quant_swiglu(rng, dt, act, K, M, norm, stream_norm, monkeypatch):
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)  # the streaming build (Q4_0/Q4_1)
    monkeypatch.setattr(blocks, "STREAM_NORM", stream_norm)  # ... normalizing on the way in, or not
    outs, refs = quant_siblings(rng, [dt] * 2, K, (M, M), norm=norm, act=act)
    g, (fused,) = _compute(outs, CUDA)
    assert [s.kernel for s in g.plan.steps] == [act_symbol(outs[0], act, norm)]
    gp, (plain,) = _compute(outs, CUDA, fuse=False)
    assert nmse(fused, plain) <= nmse_fused_vs_plain(g, gp)
    assert nmse(fused, refs[0].reshape(fused.shape)) <= nmse_vs_reference(g)


@cuda
@pytest.mark.parametrize("dt", [gg.Q4_0, gg.Q4_1])
@pytest.mark.parametrize("norm,act,K,rows", [(True, "", 576, (576, 192, 192)), (False, "", 2304, (1029, 257, 131)),
                                              (True, "silu", 576, (1536, 1536)), (False, "gelu", 512, (45, 45))])
def test_cuda_small_siblings_equal_the_default_build(rng, dt, norm, act, K, rows, monkeypatch):
    """Small QX matrices take 4 rows a slot (mul_mat_sibq*_qx_small, blocks.SIB_SMALL_ROWS): the
    same sums, bit for bit, as the default build (SIB_SMALL_ROWS = 0), and the reference."""
    outs, refs = quant_siblings(rng, [dt] * len(rows), K, rows, norm=norm, act=act)
    g, small = _compute(outs, CUDA)
    assert g.plan.steps[0].kernel.endswith("_qx_small") and len(g.plan.steps) == 1, str(g.plan)
    monkeypatch.setattr(blocks, "SIB_SMALL_ROWS", 0)
    g8, default = _compute(outs, CUDA)
    assert not g8.plan.steps[0].kernel.endswith("_small")
    for s, d, r in zip(small, default, refs):
        np.testing.assert_array_equal(s, d)
        assert nmse(s, r.reshape(s.shape)) <= nmse_vs_reference(g)


@pytest.mark.compile_all
def test_quant_sibling_launches_fit_their_kernels(rng, monkeypatch):
    """The packed arguments of every quantized sibling kernel match its CUBIN signature (NVRTC,
    no GPU): with and without the norm, and the SwiGLU epilogue; F32 and (Q4_0, Q4_1) int8
    activations."""
    from gg.backends.cuda.families import blocks
    from test_kernel_contract import _lowered, mismatch
    graphs = []
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)  # small products take the streaming builds too
    monkeypatch.setattr(blocks, "STREAM_NORM", True)  # ... normalizing ones included
    for qx in (True, False):
        monkeypatch.setattr(blocks, "QUANT_ACTIVATIONS", qx)
        for dt in QTYPES:
            if not qx and dt not in blocks.QX_TYPES:
                continue
            for norm, act in ((True, ""), (False, ""), (True, "silu"), (False, "gelu")):
                outs, _ = quant_siblings(rng, [dt] * (2 if act else 3), 512, (64, 64) if act else (64, 32, 32),
                                         norm=norm, act=act)
                graphs.append(gg.build_forward(*outs, backends=("cuda",)))
                assert graphs[-1].plan  # planned now, under this setting
            (one,), _ = quant_siblings(rng, [dt], 512, (96,))  # matmul's normalizing mat-vec, quantized
            graphs.append(gg.build_forward(one, backends=("cuda",)))
            suffix = "_qx" if qx and dt in blocks.QX_TYPES else ""
            want = (blocks.vecs_name(dt, blocks.vecs(dt, 96, 512, norm=True).R, norm=True) if blocks.streams(one.src[0])
                    else f"mul_mat_sibq_norm_{dt.name}_f32{suffix}")
            assert graphs[-1].plan.steps[0].kernel == want
    monkeypatch.setattr(blocks, "QUANT_ACTIVATIONS", True)
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 2 ** 22)  # nothing streams: the _small builds
    for dt in blocks.QX_TYPES:
        for norm, act in ((True, ""), (False, ""), (True, "silu"), (False, "gelu")):
            outs, _ = quant_siblings(rng, [dt] * (2 if act else 3), 576, (64, 64) if act else (64, 32, 32),
                                     norm=norm, act=act)
            graphs.append(gg.build_forward(*outs, backends=("cuda",)))
            assert graphs[-1].plan.steps[0].kernel.endswith("_qx_small")
    rt, records = _lowered(graphs)
    names = {r.name for r in records}
    assert len(names) == 41 and all(n.startswith(("mul_mat_sibq", "mul_mat_sibs", "mul_mat_vecs")) for n in names)
    assert {"mul_mat_vecs4_norm_q4_0_f32_qx", "mul_mat_sibs4_norm_silu_q4_1_f32_qx",
            "mul_mat_sibq_norm_q4_1_f32_qx_small", "mul_mat_sibq_gelu_q4_0_f32_qx_small"} <= names
    assert not [m for r in records if (m := mismatch(rt, r))]
