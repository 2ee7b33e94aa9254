"""mul_mat -> add (a residual connection) fused into the CUDA mat-vec kernel: the plan, and the
result against float64 numpy and the unfused graph (bit-exact: the same float sum is rounded once)."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda.families import blocks
from reference import ref_add, ref_mul_mat
from reference_helpers import nmse, nmse_vs_reference


ORDERS = ["mm + r", "r + mm"]


def build(ctx, rng, M=1000, K=520, T=1, wdt=np.float16, order="mm + r"):
    w = ctx.tensor(rng.standard_normal((M, K)).astype(wdt), name="w")      # ne (K, M)
    x = ctx.tensor(rng.standard_normal((T, K)).astype(np.float32), name="x")
    r = ctx.tensor(rng.standard_normal((T, M)).astype(np.float32), name="r")
    mm = gg.mul_mat(w, x)
    return (gg.add(mm, r) if order == "mm + r" else gg.add(r, mm)), (w, x, r)


def cuda_ops(*outs):
    return [s.ops for s in gg.build_forward(*outs, backends=("cuda", "cpu")).plan.steps]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("T", [1, 3])
def test_plan_fuses_residual_into_matvec(T, order):
    out, _ = build(gg.Context(), np.random.default_rng(0), T=T, order=order)
    steps = gg.build_forward(out, backends=("cuda", "cpu")).plan.steps
    # the mat-vec build that runs (K = 520 is not a multiple of 8: no wide build) adds the residual
    want = "mul_mat_vec1_f16_f32" if T == 1 else "mul_mat_vec_f16_f32"
    assert [(s.ops, s.kernel) for s in steps] == [(("mul_mat", "add"), want)]
    assert all(len(s.ops) == 1 for s in gg.build_forward(out, backends=("cpu",)).plan.steps)


def test_plan_keeps_broadcast_and_gemm_unfused():
    ctx, rng = gg.Context(), np.random.default_rng(1)
    w = ctx.tensor(rng.standard_normal((64, 32)).astype(np.float16))
    x = ctx.tensor(rng.standard_normal((1, 32)).astype(np.float32))
    bias = ctx.tensor(rng.standard_normal(8).astype(np.float32))  # repeats over the row: unfused
    y = gg.add(gg.mul_mat(w, x), bias)
    assert ("mul_mat", "add") not in [s.ops for s in gg.build_forward(y, backends=("cuda", "cpu")).plan.steps]
    big, _ = build(gg.Context(), rng, T=64)  # a GEMM, not a mat-vec
    assert ("mul_mat", "add") not in [s.ops for s in gg.build_forward(big, backends=("cuda", "cpu")).plan.steps]


def test_plan_keeps_illegal_forms_unfused():
    """Either order fuses only a row-for-row add of an F32 residual to a product used nowhere else."""
    ctx, rng = gg.Context(), np.random.default_rng(3)
    w = ctx.tensor(rng.standard_normal((64, 32)).astype(np.float16))
    x = ctx.tensor(rng.standard_normal((1, 32)).astype(np.float32))
    mm = gg.mul_mat(w, x)                                               # ne (64, 1)
    wide = ctx.tensor(rng.standard_normal((3, 64)).astype(np.float32))  # ne (64, 3): mm repeats over it
    half = ctx.tensor(rng.standard_normal((1, 64)).astype(np.float16))
    fused = ("mul_mat", "add")
    assert fused not in cuda_ops(gg.add(wide, mm))       # the sum has wide's shape, not the product's
    assert fused not in cuda_ops(gg.add(mm, mm))         # x + x: the product is both operands
    assert fused not in cuda_ops(gg.add(half, mm))       # an F16 sum
    r = ctx.tensor(rng.standard_normal((1, 64)).astype(np.float32))
    assert fused in cuda_ops(gg.add(r, mm))
    assert fused not in cuda_ops(gg.add(r, mm), mm)      # the product is an output too
    assert fused not in cuda_ops(gg.add(r, mm), gg.scale(mm, 2.0))  # ... or read by another node
    assert fused not in cuda_ops(gg.sub(r, mm))          # sub is no declared chain, and not commutative


@pytest.mark.parametrize("order", ["x + mul", "mul + x"])
@pytest.mark.parametrize("w_first", [False, True])
def test_cpu_norm_chain_in_either_order(order, w_first):
    """The CPU's rms_norm -> mul -> add chain with each commutative op's operands either way:
    one step, and the same values as the steps apart and as float64."""
    from reference import ref_mul, ref_rms_norm
    rng = np.random.default_rng(4)
    T = 1 if w_first else 3  # w repeats over the rows of rms_norm(x) only as mul's src1
    xs, ws, rs = (rng.standard_normal(s).astype(np.float32) for s in ((T, 37), (37,), (T, 37)))
    results = []
    for fuse in (True, False):
        ctx = gg.Context()
        x, w, res = ctx.tensor(xs), ctx.tensor(ws), ctx.tensor(rs)
        n = gg.rms_norm(x, 1e-6)
        h = gg.mul(w, n) if w_first else gg.mul(n, w)
        y = gg.add(h, res) if order == "mul + x" else gg.add(res, h)
        g = gg.build_forward(y, backends=("cpu",), fuse=fuse)
        assert ([s.ops for s in g.plan.steps] == [("rms_norm", "mul", "add")]) is fuse
        g.compute()
        results.append(y.numpy())
    ref = ref_add(ref_mul(ref_rms_norm(xs, 1e-6), ws), rs)
    assert nmse(results[0], ref.reshape(results[0].shape)) <= 1e-7
    assert np.array_equal(results[0], results[1])


@pytest.mark.cuda
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("T,wdt,K", [(1, np.float16, 520), (5, np.float32, 520), (1, np.float16, 4096)])
def test_matvec_add_matches_reference_and_unfused(T, wdt, K, order):
    """K = 4096 takes the wide build (a block per row), the others the warp-per-row builds."""
    results = []
    for fuse in (True, False):
        out, (w, x, r) = build(gg.Context(), np.random.default_rng(2), M=1001, K=K, T=T, wdt=wdt, order=order)
        g = gg.build_forward(out, backends=("cuda", "cpu"), fuse=fuse)
        assert (("mul_mat", "add") in [s.ops for s in g.plan.steps]) is fuse
        g.compute()
        assert all(s.backend == "cuda" for s in g.plan.steps)
        results.append(out.numpy())
        ref = ref_add(ref_mul_mat(w.numpy(), x.numpy()), r.numpy())
        assert nmse(results[-1], ref.reshape(results[-1].shape)) <= 1e-7
    assert np.array_equal(results[0], results[1])


# ---- quantized weights: the blocks-in-place mat-vec (kernels/quant.cu) adds the residual ------------
def build_quant(ctx, rng, dt, M=301, K=512, T=1, order="mm + r"):
    from test_quant_ops import random_weights
    w = random_weights(rng, dt, M, K, ctx)
    x = ctx.tensor(rng.standard_normal((T, K)).astype(np.float32), name="x")
    r = ctx.tensor(rng.standard_normal((T, M)).astype(np.float32), name="r")
    mm = gg.mul_mat(w, x)
    return (gg.add(mm, r) if order == "mm + r" else gg.add(r, mm)), (w, x, r)


QTYPES = [gg.Q8_0, gg.Q4_0, gg.Q4_1, gg.Q4_K, gg.Q6_K]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dt", QTYPES)
def test_plan_fuses_residual_into_quant_matvec(dt, order):
    rng = np.random.default_rng(5)
    for T in (1, 3):
        out, (w, _, _) = build_quant(gg.Context(), rng, dt, T=T, order=order)
        steps = gg.build_forward(out, backends=("cuda", "cpu")).plan.steps
        want = blocks.matvec1_symbol(w) if T == 1 else f"mul_mat_vec_{dt.name}_f32"
        assert [(s.ops, s.kernel) for s in steps] == [(("mul_mat", "add"), want)]
    big, _ = build_quant(gg.Context(), rng, dt, T=40, order=order)  # dequantized + GEMM: the add stays
    assert ("mul_mat", "add") not in cuda_ops(big)


@pytest.mark.cuda
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dt,T", [(gg.Q8_0, 1), (gg.Q4_0, 3), (gg.Q4_1, 1), (gg.Q4_K, 1), (gg.Q6_K, 5)])
def test_quant_matvec_add_matches_reference_and_unfused(dt, T, order):
    results = []
    for fuse in (True, False):
        out, (w, x, r) = build_quant(gg.Context(), np.random.default_rng(6), dt, M=1001, K=768, T=T, order=order)
        g = gg.build_forward(out, backends=("cuda", "cpu"), fuse=fuse)
        assert (("mul_mat", "add") in [s.ops for s in g.plan.steps]) is fuse
        g.compute()
        assert all(s.backend == "cuda" for s in g.plan.steps)
        results.append(out.numpy())
        ref = ref_add(ref_mul_mat(w.numpy(), x.numpy()), r.numpy())  # w.numpy(): the dequantized weights
        assert nmse(results[-1], ref.reshape(results[-1].shape)) <= nmse_vs_reference(g)
    assert np.array_equal(results[0], results[1])
