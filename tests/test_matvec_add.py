"""mul_mat -> add (a residual connection) fused into the CUDA mat-vec kernel: the plan, and the
result against float64 numpy and the unfused graph (bit-exact: the same float sum is rounded once)."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from reference import ref_add, ref_mul_mat
from reference_helpers import nmse


def build(ctx, rng, M=1000, K=520, T=1, wdt=np.float16):
    w = ctx.tensor(rng.standard_normal((M, K)).astype(wdt), name="w")      # ne (K, M)
    x = ctx.tensor(rng.standard_normal((T, K)).astype(np.float32), name="x")
    r = ctx.tensor(rng.standard_normal((T, M)).astype(np.float32), name="r")
    return gg.add(gg.mul_mat(w, x), r), (w, x, r)


@pytest.mark.parametrize("T", [1, 3])
def test_plan_fuses_residual_into_matvec(T):
    out, _ = build(gg.Context(), np.random.default_rng(0), T=T)
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


@pytest.mark.cuda
@pytest.mark.parametrize("T,wdt", [(1, np.float16), (5, np.float32)])
def test_matvec_add_matches_reference_and_unfused(T, wdt):
    results = []
    for fuse in (True, False):
        out, (w, x, r) = build(gg.Context(), np.random.default_rng(2), M=1001, K=520, T=T, wdt=wdt)
        g = gg.build_forward(out, backends=("cuda", "cpu"), fuse=fuse)
        g.compute()
        assert all(s.backend == "cuda" for s in g.plan.steps)
        results.append(out.numpy())
        ref = ref_add(ref_mul_mat(w.numpy(), x.numpy()), r.numpy())
        assert nmse(results[-1], ref.reshape(results[-1].shape)) <= 1e-7
    assert np.array_equal(results[0], results[1])
