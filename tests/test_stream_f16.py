"""F16 weights on the streaming mat-vec (kernels/quant.cu QF16, blocks.STREAM_F16): one-column
products, their residual and the SwiGLU / GeGLU pairs read F16 rows as 64-byte blocks of 32
elements with the activations kept in F32. Plans need no GPU; values are checked on the GPU against
float64 (F32 arithmetic: far inside the F16 mat-vec's bound) and against the builds they replace."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda.families import blocks
from reference import nmse, ref_gelu, ref_rms_norm, ref_silu

cuda = pytest.mark.cuda
EPS = 1e-5
NMSE_F32 = 1e-9  # F16 weights are exact in F32: only the F32 sums' rounding remains


def f16_weights(rng, ctx, rows: int, k: int, lo: int = 0, pad: int = 0):
    """(k, rows) F16 weights as a view from row `lo` of a matrix whose rows are `pad` elements
    longer (row stride 2 (k + pad) bytes: pad 1 leaves rows only 2-aligned), and their values."""
    full = (rng.standard_normal((rows + lo, k + pad)) * 0.5).astype(np.float16)
    t = ctx.tensor(full)
    return gg.view_2d(t, k, rows, t.nb[1], lo * t.nb[1]), full[lo:, :k].astype(np.float64)


# (rows, K, lo, pad, xoff, residual): one block and a partial last chunk (K = 32, 4128), long rows
# in parts (14336), short rows side by side (576, 160), every R, rows off a 16-byte boundary (lo,
# pad 1: 2-aligned rows alternating between 4-aligned and not; pad 2: 4-aligned), x off 16 bytes.
CASES = [(40, 32, 0, 0, 0, False), (17, 4128, 3, 0, 1, True), (50, 14336, 1, 0, 0, True),
         (33, 576, 2, 1, 3, False), (300, 4096, 0, 0, 0, True), (4500, 4096, 1, 0, 0, True),
         (3000, 4096, 0, 1, 1, False), (9000, 160, 0, 0, 0, False), (29, 1056, 0, 2, 0, True),
         (37, 4096, 0, 8, 0, False)]


def test_f16_products_plan_the_streaming_build(monkeypatch):
    """Big enough one-column F16 products (and a residual in either operand order) take
    mul_mat_vecs<R>_f16_f32; small ones, several columns, K % 32 != 0 and STREAM_F16 off keep
    mul_mat_vecw."""
    ctx = gg.Context()
    w = ctx.new_tensor(gg.F16, (4096, 4096))
    x, r = ctx.new_tensor(gg.F32, (4096,)), ctx.new_tensor(gg.F32, (4096,))
    plan = lambda t: [s.kernel for s in gg.build_forward(t, backends=("cuda",)).plan.steps]  # noqa: E731
    sym = blocks.vecs_name(gg.F16, blocks.vecs(gg.F16, 4096, 4096).R)
    assert sym.endswith("_f16_f32") and plan(gg.mul_mat(w, x)) == [sym]
    assert plan(gg.add(gg.mul_mat(w, x), r)) == plan(gg.add(r, gg.mul_mat(w, x))) == [sym]
    assert plan(gg.mul_mat(ctx.new_tensor(gg.F16, (4096, 64)), x)) == ["mul_mat_vecw_f16_f32"]  # < MVS_MIN_ELEMENTS
    assert plan(gg.mul_mat(ctx.new_tensor(gg.F16, (4104, 4096)), ctx.new_tensor(gg.F32, (4104,)))) == [
        "mul_mat_vecw_f16_f32"]  # K % 32 != 0
    assert plan(gg.mul_mat(w, ctx.new_tensor(gg.F32, (4096, 2)))) == ["mul_mat_vec_f16_f32"]
    monkeypatch.setattr(blocks, "STREAM_F16", False)
    assert plan(gg.mul_mat(w, x)) == ["mul_mat_vecw_f16_f32"]


def _ffn(ctx, rng, K: int, M: int, act: str = "silu", norm: bool = True):
    x, nw = rng.standard_normal(K).astype(np.float32) * 3, rng.standard_normal(K).astype(np.float32)
    (wg, g64), (wu, u64) = f16_weights(rng, ctx, M, K), f16_weights(rng, ctx, M, K)
    xt = ctx.tensor(x)
    h = gg.mul(gg.rms_norm(xt, EPS), ctx.tensor(nw)) if norm else xt
    y = gg.mul(getattr(gg, act)(gg.mul_mat(wg, h)), gg.mul_mat(wu, h))
    h64 = ref_rms_norm(x[None].astype(np.float64), EPS)[0] * nw if norm else x.astype(np.float64)
    return y, (ref_silu if act == "silu" else ref_gelu)(g64 @ h64) * (u64 @ h64)


def test_f16_swiglu_plans(rng, monkeypatch):
    """The pair streams with the norm in it (llama-3-8B dims too: no byte limit for F16 weights,
    families/siblings.py), or without one; STREAM_F16_PAIRS off: the F16 sibling kernel as before."""
    ctx = gg.Context()
    for K, M, norm in ((2048, 5632, True), (4096, 14336, True), (4096, 14336, False)):
        y, _ = _ffn(ctx, rng, K, M, norm=norm)
        steps = gg.build_forward(y, backends=("cuda",)).plan.steps
        assert [s.kernel for s in steps] == [blocks.sibs_name(gg.F16, steps[0].choice.vecs.R, "silu", norm)]
        assert steps[0].kernel.startswith("mul_mat_sibs") and steps[0].kernel.endswith("_silu_f16_f32")
    monkeypatch.setattr(blocks, "STREAM_F16_PAIRS", False)
    steps = gg.build_forward(y, backends=("cuda",)).plan.steps
    assert [s.kernel for s in steps] == ["mul_mat_sib_silu_f16_f32"]


@cuda
@pytest.mark.parametrize("rows,k,lo,pad,xoff,res", CASES)
def test_cuda_f16_streaming_matvec(rows, k, lo, pad, xoff, res, rng, monkeypatch):
    """Every case against float64 and against mul_mat_vecw (STREAM_F16 off), computed twice with a
    new x (long rows' parts meet through tickets the last block resets)."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    w, w64 = f16_weights(rng, ctx, rows, k, lo, pad)
    xa = rng.standard_normal(k + xoff).astype(np.float32)
    xt = ctx.tensor(xa)
    x = gg.view_1d(xt, k, xoff * 4)
    rt = ctx.tensor(rng.standard_normal(rows).astype(np.float32))
    outs = [gg.add(rt, gg.mul_mat(w, x)) if res else gg.mul_mat(w, x) for _ in range(2)]
    g = gg.build_forward(outs[0], backends=("cuda",))
    assert [s.kernel for s in g.plan.steps] == [blocks.matvec1_symbol(w)] and g.plan.steps[0].kernel.endswith("_f16_f32")
    monkeypatch.setattr(blocks, "STREAM_F16", False)
    plain = gg.build_forward(outs[1], backends=("cuda",))
    assert not plain.plan.steps[0].kernel.startswith("mul_mat_vecs")
    for _ in range(2):
        g.compute()
        plain.compute()
        got = outs[0].numpy().reshape(-1)
        assert nmse(got, w64 @ xa[xoff:].astype(np.float64) + (rt.numpy() if res else 0.0)) <= NMSE_F32
        assert nmse(got, outs[1].numpy().reshape(-1)) <= NMSE_F32
        xa = rng.standard_normal(k + xoff).astype(np.float32)
        xt.set(xa)


@cuda
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("K,M,norm", [(4096, 700, True), (4096, 700, False), (1056, 3001, False), (14336, 40, True),
                                      (576, 1536, True)])
def test_cuda_f16_streaming_swiglu(act, K, M, norm, rng, monkeypatch):
    """act(Wg·h) * (Wu·h) on the streaming pair (K = 14336: in parts; 576: rows side by side), h =
    x or rms_norm(x) * w taken in, against float64."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    y, ref = _ffn(ctx, rng, K, M, act, norm)
    g = gg.build_forward(y, backends=("cuda",))
    assert [s.kernel[:12] for s in g.plan.steps] == ["mul_mat_sibs"]
    g.compute()
    assert nmse(y.numpy().reshape(-1), ref) <= NMSE_F32


@pytest.mark.compile_all
def test_f16_streaming_launches_fit_their_kernels(rng, monkeypatch):
    """The packed arguments of the F16 streaming builds (a product, with the residual, the pair
    with and without the norm) match the CUBIN signatures (NVRTC, no GPU)."""
    from test_kernel_contract import _lowered, mismatch
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    w, _ = f16_weights(rng, ctx, 300, 4096)
    x, r = ctx.tensor(rng.standard_normal(4096).astype(np.float32)), ctx.tensor(rng.standard_normal(300).astype(np.float32))
    graphs = [gg.build_forward(t, backends=("cuda",)) for t in (gg.mul_mat(w, x), gg.add(gg.mul_mat(w, x), r),
                                                                _ffn(ctx, rng, 1024, 300)[0],
                                                                _ffn(ctx, rng, 1024, 300, "gelu", False)[0])]
    rt, records = _lowered(graphs)
    assert [rec.name[:12] for rec in records] == ["mul_mat_vecs"] * 2 + ["mul_mat_sibs"] * 2
    assert not [m for rec in records if (m := mismatch(rt, rec))]
