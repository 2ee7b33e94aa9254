"""The planner: assignment, fusion (and when it must not happen), inserted transfers and casts,
memory planning, and the printed plan."""
import numpy as np
import pytest

import fake_backend  # noqa: F401  (registers the "fake" backend)
import gg
from gg.backends import base
from reference_helpers import nmse


def ops_of(graph):
    return [s.ops for s in graph.plan.steps]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_rms_norm_mul_add_fuses_and_matches_unfused(rng):
    x, w, b = gg.tensor(f32(rng, 7, 511)), gg.tensor(f32(rng, 511)), gg.tensor(f32(rng, 7, 511))
    y = gg.add(gg.mul(gg.rms_norm(x, 1e-5), w), b)
    fused = gg.build_forward(y, backends=("cpu",))
    assert ops_of(fused) == [("rms_norm", "mul", "add")]
    fused.compute()
    got = y.numpy()
    plain = gg.build_forward(y, backends=("cpu",), fuse=False)
    assert ops_of(plain) == [("rms_norm",), ("mul",), ("add",)]
    plain.compute()
    np.testing.assert_array_equal(got, y.numpy())


@pytest.mark.parametrize("masking", ["add", "diag"])
def test_softmax_chain_fuses(rng, masking):
    x = gg.tensor(f32(rng, 3, 5, 9))
    s = gg.scale(x, 0.25)
    if masking == "add":
        m = gg.tensor(f32(rng, 5, 9))
        s, pattern = gg.add(s, m), ("scale", "add", "soft_max")
    else:
        s, pattern = gg.diag_mask_inf(s, 4), ("scale", "diag_mask_inf", "soft_max")
    y = gg.soft_max(s)
    g = gg.build_forward(y, backends=("cpu",))
    assert ops_of(g) == [pattern]
    g.compute()
    got = y.numpy()
    gg.build_forward(y, backends=("cpu",), fuse=False).compute()
    np.testing.assert_array_equal(got, y.numpy())


def test_no_fusion_env(monkeypatch, rng):
    monkeypatch.setenv("GG_NO_FUSION", "1")
    x, w = gg.tensor(f32(rng, 4, 8)), gg.tensor(f32(rng, 8))
    assert ops_of(gg.build_forward(gg.rms_norm(x, 1e-6) * w, backends=("cpu",))) == [("rms_norm",), ("mul",)]


def _illegal_cases(rng):
    x, w = gg.tensor(f32(rng, 4, 16)), gg.tensor(f32(rng, 16))
    n = gg.rms_norm(x, 1e-6)
    yield "read twice", [gg.mul(n, w) + n], None
    n2 = gg.rms_norm(x, 1e-6)
    yield "intermediate is an output", [gg.mul(n2, w), n2], None
    n3 = gg.rms_norm(x, 1e-6)
    v = gg.view_1d(n3, 16, 0)
    yield "intermediate is viewed", [gg.mul(n3, w), v], None
    n4 = gg.rms_norm(gg.tensor(f32(rng, 1, 16)), 1e-6)
    yield "intermediate is src1", [gg.mul(gg.tensor(f32(rng, 4, 16)), n4)], None
    n5 = gg.rms_norm(x, 1e-6)
    yield "squared", [gg.mul(n5, n5)], None


def test_illegal_fusions_do_not_happen_and_stay_correct(rng):
    for what, outs, _ in _illegal_cases(rng):
        g = gg.build_forward(*outs, backends=("cpu",))
        assert all(len(s.ops) == 1 for s in g.plan.steps), (what, ops_of(g))
        g.compute()
        got = [o.numpy() for o in outs]
        gg.build_forward(*outs, backends=("cpu",), fuse=False).compute()
        for a, o in zip(got, outs):
            np.testing.assert_array_equal(a, o.numpy(), err_msg=what)


def test_no_fusion_across_a_cache_write(rng):
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F32, (8, 4), persistent=True)
    x = gg.tensor(f32(rng, 4, 8))
    n = gg.rms_norm(gg.view_2d(cache, 8, 4, 32, 0), 1e-6)   # reads the cache...
    g = gg.build_forward(n, backends=("cpu",))
    g.build_forward_expand(gg.cpy(x, gg.view_2d(cache, 8, 4, 32, 0)))  # ...which is written next
    w = gg.tensor(f32(rng, 8))
    g.build_forward_expand(gg.mul(n, w))
    assert all(len(s.ops) == 1 for s in g.plan.steps)


def test_plan_for_cuda_without_gpu(rng):
    x, w = gg.tensor(f32(rng, 4, 64)), gg.tensor(f32(rng, 64))
    cache = gg.new_tensor(gg.F16, (64, 16), persistent=True)
    y = gg.rms_norm(x, 1e-6) * w
    g = gg.build_forward(y, backends=("cuda", "cpu"))
    g.build_forward_expand(gg.cpy(y, gg.view_2d(cache, 64, 4, 128, 0)))
    plan = g.plan
    assert [s.backend for s in plan.steps] == ["cuda", "cuda"]
    assert plan.steps[0].ops == ("rms_norm", "mul")
    assert plan.steps[1].kernel == "cpy_f32_f16"
    if not base.available("cuda"):
        with pytest.raises(gg.BackendError, match="cuda"):
            g.compute()


def _gqa_attention(rng, kdt=np.float16, hd=64, n_kv=100, nkv=2, T=37, nh=8, n_ctx=128):
    """KQ and KQV of a GQA attention over cache views: K (hd, n_ctx, nkv) read as (hd, n_kv, nkv),
    V transposed (n_ctx, hd, nkv) read as (n_kv, hd, nkv), q F32 permuted to (hd, T, nh)."""
    K = gg.tensor(rng.standard_normal((nkv, n_ctx, hd)).astype(kdt))
    V = gg.tensor(rng.standard_normal((nkv, hd, n_ctx)).astype(kdt))
    q = gg.permute(gg.tensor(f32(rng, T, nh, hd)), 0, 2, 1, 3)
    kq = gg.mul_mat(gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0), q)       # (n_kv, T, nh)
    kqv = gg.mul_mat(gg.view_3d(V, n_kv, hd, nkv, V.nb[1], V.nb[2], 0), gg.soft_max(kq))
    return kq, kqv


def test_cuda_plan_gqa_mul_mat_uses_cublas(rng, monkeypatch):
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)  # nvmath need not be installed here
    kq, kqv = _gqa_attention(rng)
    plan = gg.build_forward(kqv, backends=("cuda", "cpu")).plan
    mm = [s for s in plan.steps if s.ops == ("mul_mat",)]
    assert [s.kernel for s in mm] == ["cublas_gemm_batched"] * 2, plan
    for s in mm:  # b is cast to a contiguous F16 copy; prepare time (the real b) decides the same
        a, b = s.srcs(s.out)
        assert b.dtype is gg.F16 and b.is_contiguous() and support.gqa_ratio(a, b) == 4
        assert support.path(s.out, s.out.src[0], b) == "cublas"


def test_cuda_plan_gqa_mul_mat_tiled_unless_foldable(rng, monkeypatch):
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    # F32 cache: q needs no cast, and its heads lie hd apart (not T columns): no K x (T*r) matrix
    kq, _ = _gqa_attention(rng, kdt=np.float32)
    assert gg.build_forward(kq, backends=("cuda", "cpu")).plan.steps[-1].kernel == "mul_mat_tiled_f32_f32"
    # broadcast over dim 3 (a.ne[3] < b.ne[3]) stays on the tiled kernel too
    a = gg.tensor(f32(rng, 1, 2, 100, 64))
    b = gg.tensor(f32(rng, 3, 8, 37, 64))
    assert gg.build_forward(gg.mul_mat(a, b), backends=("cuda", "cpu")).plan.steps[-1].kernel == "mul_mat_tiled_f32_f32"
    c = gg.tensor(f32(rng, 3, 8, 37, 64))  # the same, contiguous and folded per head, is cuBLAS
    a3 = gg.tensor(f32(rng, 3, 2, 100, 64))
    assert gg.build_forward(gg.mul_mat(a3, c), backends=("cuda", "cpu")).plan.steps[-1].kernel == "cublas_gemm_batched"


def test_cublas_gemm_gqa_args_compute_the_product(rng, monkeypatch):
    """Gemm's sizes and strides for GQA, checked by a numpy stand-in for cuBLAS on host memory."""
    import ctypes
    from types import SimpleNamespace
    from gg.backends.cuda import cublas
    from reference import NMSE_MUL_MAT, ref_mul_mat

    np_dt = {0: np.float32, 2: np.float16}

    def matrices(ptr, dt, ld, stride, rows, cols, batch):  # column-major: column j at ptr + j*ld
        dt = np.dtype(np_dt[dt])
        n = (batch - 1) * stride + (cols - 1) * ld + rows
        base = np.frombuffer((ctypes.c_char * (n * dt.itemsize)).from_address(ptr), dt)
        s = dt.itemsize
        return np.lib.stride_tricks.as_strided(base, (batch, cols, rows), (stride * s, ld * s, s))

    def gemm(h, op_a, op_b, M, N, K, alpha, A, ta, lda, sa, B, tb, ldb, sb, beta, C, tc, ldc, sc, batch, *_):
        assert (op_a, op_b) == (cublas._OP_T, cublas._OP_N)
        a = matrices(A, ta, lda, sa, K, M, batch).astype(np.float64)
        b = matrices(B, tb, ldb, sb, K, N, batch).astype(np.float64)
        c = b @ a.transpose(0, 2, 1)
        np.copyto(matrices(C, tc, ldc, sc, M, N, batch), c.astype(np.float32))

    monkeypatch.setattr(cublas, "_lib", lambda: SimpleNamespace(gemm_strided_batched_ex=gemm))
    monkeypatch.setattr(cublas, "handle", lambda rt: 0)
    hd, n_kv, nkv, T, nh, n_ctx = 64, 77, 2, 33, 8, 96
    kc = rng.standard_normal((nkv, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((nkv, hd, n_ctx)).astype(np.float16)
    K, V = gg.tensor(kc), gg.tensor(vc)
    k = gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)
    v = gg.view_3d(V, n_kv, hd, nkv, V.nb[1], V.nb[2], 0)
    for a, a_np, b_np in ((k, kc[:, :n_kv], rng.standard_normal((nh, T, hd))),
                          (v, vc[:, :, :n_kv], rng.standard_normal((nh, T, n_kv)))):
        b_np = b_np.astype(np.float16)
        b = gg.tensor(b_np)
        out = gg.mul_mat(a, b)
        host = {a.root: kc if a.root is K else vc, b: b_np, out: np.zeros(out.ne[2::-1], np.float32)}
        g = cublas.Gemm(None, "kq", out, a, b, lambda t: host[t.root].ctypes.data + t.view_offs)
        assert g.args[3:6] == (out.ne[0], out.ne[1] * 4, a.ne[0]) and g.args[-3] == nkv  # M, N*r, K; batch
        g()
        assert nmse(host[out], ref_mul_mat(a_np, b_np)) <= NMSE_MUL_MAT


def _prefill_residual(rng, T=96, K=128, read_again=False, own_input=False):
    """out = add(mul_mat(W, silu(h)), h) or add(h, mul_mat(...)) over T tokens, h an intermediate
    (the residual stream); read_again: h is read after the add too; own_input: the product reads
    h itself."""
    x, y = gg.tensor(f32(rng, T, K)), gg.tensor(f32(rng, T, K))
    h = gg.add(x, y)
    w = gg.tensor(rng.standard_normal((K, K)).astype(np.float16) * np.float16(0.1))
    mm = gg.mul_mat(w, h if own_input else gg.silu(h))
    out = gg.add(mm, h) if T % 2 else gg.add(h, mm)
    return (gg.mul(out, h) if read_again else out), h, out


@pytest.mark.parametrize("T", [96, 97])  # add(h, mm) and add(mm, h)
def test_cuda_plan_prefill_residual_in_the_gemm(rng, monkeypatch, T):
    """A prefill's residual add runs in the cuBLAS call (cublas_gemm_add, beta 1), whose output
    takes the residual's bytes where the residual dies at the add, and only there."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    y, h, out = _prefill_residual(rng, T)
    plan = gg.build_forward(y, backends=("cuda", "cpu")).plan
    (step,) = [s for s in plan.steps if s.out is out]
    assert step.ops == ("mul_mat", "add") and step.kernel == "cublas_gemm_add", str(plan)
    assert plan.alloc.inplace.get(out) is h, str(plan)
    y, h, out = _prefill_residual(rng, T, read_again=True)
    plan = gg.build_forward(y, backends=("cuda", "cpu")).plan
    assert [s.kernel for s in plan.steps if s.out is out] == ["cublas_gemm_add"] and out not in plan.alloc.inplace
    y, h, out = _prefill_residual(rng, T, own_input=True)  # its F16 cast must not stand for the residual
    plan = gg.build_forward(y, backends=("cuda", "cpu")).plan
    assert [s.ops for s in plan.steps if s.out is out] == [("add",)], str(plan)
    monkeypatch.setattr(support, "GEMM_RESIDUAL", False)
    y, h, out = _prefill_residual(rng, T)
    plan = gg.build_forward(y, backends=("cuda", "cpu")).plan
    assert [s.ops for s in plan.steps if s.out is out] == [("add",)], str(plan)


@pytest.mark.parametrize("read_again", [False, True])
def test_cuda_shaped_prefill_residual_in_place_computes_the_sum(rng, monkeypatch, read_again):
    """The cuda-shaped plan (CUDA's choices and arena offsets, CPU kernels) with the residual's
    bytes taken by the fused step's output gives the CPU plan's values."""
    import cuda_shaped_backend  # noqa: F401  (registers "cudalike")
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    y, h, out = _prefill_residual(rng, 97, read_again=read_again)
    g = gg.build_forward(y, backends=("cudalike", "cpu"))
    assert any(s.kernel == "cublas_gemm_add" for s in g.plan.steps), str(g.plan)
    assert (out in g.plan.alloc.inplace) == (not read_again)
    g.compute()
    got = y.numpy().copy()
    monkeypatch.setattr(support, "GEMM_RESIDUAL", False)  # the same casts, the add a step of its own
    gp = gg.build_forward(y, backends=("cudalike", "cpu"))
    assert not any(s.kernel == "cublas_gemm_add" for s in gp.plan.steps)
    gp.compute()
    np.testing.assert_array_equal(got, y.numpy())


def test_cublas_gemm_residual_args(rng, monkeypatch):
    """Gemm with a residual: beta 1 over the output, which gets a copy of the residual first
    unless it already holds it (a numpy stand-in for cuBLAS and the copy, on host memory)."""
    import ctypes
    from types import SimpleNamespace
    from gg.backends.cuda import cublas

    def gemm(h, op_a, op_b, M, N, K, alpha, A, ta, lda, sa, B, tb, ldb, sb, beta, C, tc, ldc, sc, batch, *_):
        a = np.frombuffer((ctypes.c_float * (M * K)).from_address(A), np.float32).reshape(M, K)
        b = np.frombuffer((ctypes.c_float * (N * K)).from_address(B), np.float32).reshape(N, K)
        c = np.frombuffer((ctypes.c_float * (N * M)).from_address(C), np.float32).reshape(N, M)
        bt = np.frombuffer((ctypes.c_float * 1).from_address(beta), np.float32)[0]
        c[...] = b @ a.T + bt * c

    copies = []

    def copy(dst, src, n, stream):
        copies.append(n)
        ctypes.memmove(dst, src, n)
        return (0,)
    monkeypatch.setattr(cublas, "_lib", lambda: SimpleNamespace(gemm_strided_batched_ex=gemm))
    monkeypatch.setattr(cublas, "handle", lambda rt: 0)
    monkeypatch.setattr(cublas.cu, "cuMemcpyDtoDAsync", copy)
    monkeypatch.setattr(cublas, "check", lambda res, what: res)
    a_np, b_np, r_np = f32(rng, 40, 24), f32(rng, 33, 24), f32(rng, 33, 40)
    a, b, r = gg.tensor(a_np), gg.tensor(b_np), gg.tensor(r_np)
    out = gg.add(gg.mul_mat(a, b), r)
    want = b_np.astype(np.float64) @ a_np.T + r_np
    for same in (False, True):
        o = r_np.copy() if same else np.zeros_like(r_np)
        host = {a: a_np, b: b_np, r: o if same else r_np, out: o}
        g = cublas.Gemm(SimpleNamespace(stream=0), "wo", out, a, b, lambda t: host[t].ctypes.data, residual=r)
        g()
        assert nmse(o, want) <= 1e-12 and copies == [out.nbytes]  # one copy, the first time only


def test_transfers_between_backends(rng):
    host = gg.Context(backend="cpu")
    xa, wa = f32(rng, 3, 32), f32(rng, 32)
    x, w = host.tensor(xa), host.tensor(wa)
    y = gg.rms_norm(x, 1e-6) * w
    g = gg.build_forward(y, backends=("fake", "cpu"))
    steps = g.plan.steps
    assert [(s.ops, s.backend, s.inserted) for s in steps] == [
        (("transfer",), "fake", True), (("transfer",), "fake", True), (("rms_norm", "mul"), "fake", False)]
    assert steps[0].kernel == "transfer_cpu_to_fake"
    g.compute()
    ref = xa / np.sqrt((xa.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * wa
    assert nmse(y.numpy(), ref) < 1e-7
    assert isinstance(g.locate(y)[0], fake_backend.FakeBuffer)
    x.set(xa * 2)  # new input, same plan: the transfer runs again
    g.compute()
    assert nmse(y.numpy(), ref) < 1e-7  # rms_norm is scale-invariant


def test_fallback_and_cast_are_visible(rng):
    ctx = gg.Context()
    wa, xa = f32(rng, 16, 8), f32(rng, 2, 5, 8)
    w = ctx.tensor(wa.astype(np.float16))           # F16 weight: the fake mul_mat wants F32 -> cast
    x = ctx.tensor(xa)
    pos = ctx.tensor(np.arange(2, dtype=np.int32))
    r = gg.rope(x, pos, 8)                           # fake has no rope -> falls back to cpu
    y = gg.mul_mat(w, gg.reshape(gg.cont(r), 8, 10))
    g = gg.build_forward(y, backends=("fake", "cpu"))
    rows = [(s.ops, s.backend, s.inserted, s.kernel) for s in g.plan.steps]
    assert rows[0][:2] == (("rope",), "cpu")
    assert (("transfer",), "fake", True, "transfer_cpu_to_fake") in rows
    assert (("cast",), "fake", True, "cpy_f16_f32") in rows
    g.compute()
    cpu = gg.build_forward(y, backends=("cpu",))
    got = y.numpy()
    cpu.compute()
    np.testing.assert_allclose(got, y.numpy(), rtol=1e-5, atol=1e-5)


def test_liveness_keeps_arena_constant_for_long_chains(rng):
    n_elems = 1024
    x = gg.tensor(f32(rng, n_elems))
    t = x
    for i in range(40):
        t = gg.rms_norm(t, 1e-6) if i % 2 else gg.scale(t, 1.01)  # rms_norm cannot run in place
    g = gg.build_forward(t, backends=("cpu",), fuse=False)
    assert len(g.plan.steps) == 40
    assert g.plan.arena_bytes["cpu"] <= 3 * n_elems * 4
    assert g.plan.alloc.naive_bytes["cpu"] >= 40 * n_elems * 4
    g.compute()
    ref = x.numpy().astype(np.float64)
    for i in range(40):
        ref = ref / np.sqrt((ref ** 2).mean() + 1e-6) if i % 2 else ref * 1.01
    assert nmse(t.numpy(), ref) < 1e-7


def test_inplace_only_when_the_source_dies(rng):
    a = gg.tensor(f32(rng, 64))
    s = gg.scale(gg.rms_norm(a, 1e-6), 2.0)    # rms_norm's output dies at scale: in place
    u = gg.scale(gg.rms_norm(a, 1e-5), 3.0)
    v = gg.add(u, gg.rms_norm(a, 1e-5))        # unrelated
    g = gg.build_forward(s, v, backends=("cpu",), fuse=False)
    assert s in g.plan.alloc.inplace
    g.compute()
    x = a.numpy().astype(np.float64)
    assert nmse(s.numpy(), 2 * x / np.sqrt((x * x).mean() + 1e-6)) < 1e-7


def test_outputs_are_never_reused(rng):
    x = gg.tensor(f32(rng, 256))
    mid = gg.scale(x, 2.0)
    out = gg.scale(mid, 3.0)
    g = gg.build_forward(out, backends=("cpu",))
    g.build_forward_expand(mid)
    g.compute()
    xa = x.numpy()
    np.testing.assert_allclose(mid.numpy(), xa * 2, rtol=1e-6)
    np.testing.assert_allclose(out.numpy(), xa * 6, rtol=1e-6)


def test_printed_plan_and_dot(rng):
    x, w = gg.tensor(f32(rng, 4, 64)), gg.tensor(f32(rng, 64))
    y = gg.soft_max(gg.scale(gg.rms_norm(x, 1e-6) * w, 0.5))
    g = gg.build_forward(y, backends=("cpu",))
    text = str(g.plan)
    assert "rms_norm+mul" in text and "kernel" in text and "fused groups" in text
    assert g.plan.summary().startswith("3 steps, 1 fused groups")
    dot = g.to_dot()
    assert dot.startswith("digraph") and "s0 -> s1" in dot


def test_unknown_backend_and_cycle_and_freed_context(rng):
    x = gg.tensor(f32(rng, 4))
    with pytest.raises(gg.BackendError, match="unknown backend"):
        gg.build_forward(x * x, backends=("tpu",)).plan
    a = x + x
    b = a * x
    a.src = (b, x)  # only reachable by mutating a node: the planner must not hang
    with pytest.raises(gg.GraphError, match="cycle"):
        gg.build_forward(b)
    ctx = gg.Context()
    t = ctx.tensor(f32(rng, 4))
    y = t * t
    ctx.free()
    with pytest.raises(gg.GGError, match="freed"):
        gg.build_forward(y, backends=("cpu",)).compute()


def test_profile_table(rng):
    x, w = gg.tensor(f32(rng, 4, 64)), gg.tensor(f32(rng, 64))
    W = gg.tensor(f32(rng, 32, 64))
    y = gg.mul_mat(W, gg.rms_norm(x, 1e-6) * w)
    g = gg.build_forward(y, backends=("cpu",))
    prof = g.profile(repeat=3)
    rows = prof.rows()
    assert [r["ops"] for r in rows] == ["rms_norm+mul", "mul_mat"]
    assert rows[1]["bytes"] == (32 * 64 + 4 * 64 + 4 * 32) * 4
    assert all(r["us"] > 0 for r in rows) and abs(sum(r["share"] for r in rows) - 1) < 1e-9
    assert "TFLOP/s" in str(prof)
    ref = (x.numpy() / np.sqrt((x.numpy().astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w.numpy()) @ W.numpy().T
    assert nmse(y.numpy(), ref) < 1e-6


def test_fold_casts_into_the_softmax(rng, monkeypatch):
    """The softmax writes the F16 operand of the cuBLAS K·V product itself (`fold_casts`)."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    _, kqv = _gqa_attention(rng)
    steps = gg.build_forward(kqv, backends=("cuda", "cpu")).plan.steps
    assert [(s.ops, s.kernel) for s in steps if "soft_max" in s.ops] == [(("soft_max", "cast"), "soft_max_r4_f16")]
    assert sum(s.inserted for s in steps) == 1  # only q's cast remains a step of its own


@pytest.mark.parametrize("also", ["output", "view"])
def test_fold_casts_keeps_a_value_needed_in_f32(rng, monkeypatch, also):
    """No fold when the softmax's F32 result is needed too: a graph output, or read through a view."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    _, kqv = _gqa_attention(rng)
    probs = kqv.src[1]
    extra = probs if also == "output" else gg.cont(gg.view_1d(probs, 10, 0))
    steps = gg.build_forward(kqv, extra, backends=("cuda", "cpu")).plan.steps
    assert [s.ops for s in steps if "soft_max" in s.ops] == [("soft_max",)]
    casts = [s for s in steps if s.ops == ("cast",) and s.out.src[0] is probs]
    assert len(casts) == 1 and casts[0].inserted and casts[0].out.dtype is gg.F16


def _norm_then_gemm(rng, n=4096, rows=64, with_add=False):
    ctx = gg.Context()
    x, w = ctx.tensor(f32(rng, rows, n)), ctx.tensor(f32(rng, n))
    h = gg.mul(gg.rms_norm(x, 1e-6), w)
    if with_add:
        h = gg.add(h, ctx.tensor(f32(rng, n)))
    weight = ctx.tensor(f32(rng, 256, n).astype(np.float16))
    return gg.mul_mat(weight, h)


@pytest.mark.parametrize("with_add", [False, True])
def test_fold_casts_into_rms_norm(rng, monkeypatch, with_add):
    """rms_norm * w (+ b) writes the F16 operand of the cuBLAS product itself."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    steps = gg.build_forward(_norm_then_gemm(rng, with_add=with_add), backends=("cuda", "cpu")).plan.steps
    want = ("rms_norm", "mul", "add", "cast") if with_add else ("rms_norm", "mul", "cast")
    assert [s.ops for s in steps] == [want, ("mul_mat",)]
    assert steps[0].out.dtype is gg.F16 and not any(s.inserted for s in steps)


def test_fold_casts_not_into_rms_norm_rows_the_kernel_cannot_take(rng, monkeypatch):
    """Rows of 4100 (not a multiple of 8) take the general norm kernel, which writes x's dtype."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    steps = gg.build_forward(_norm_then_gemm(rng, n=4100), backends=("cuda", "cpu")).plan.steps
    assert [s.ops for s in steps] == [("rms_norm", "mul"), ("cast",), ("mul_mat",)]


def _heads_to_gemm(rng, extra_reader=False):
    """The attention output (hd, T, heads) permuted to (hd, heads, T), made contiguous and reshaped
    into the (n_embd, T) operand of a GEMM - the llama block's path to its output projection."""
    ctx = gg.Context()
    kqv = ctx.tensor(f32(rng, 6, 40, 32))                     # ne (32 hd, 40 T, 6 heads)
    flat = gg.reshape(gg.cont(gg.permute(kqv, 0, 2, 1, 3)), 32 * 6, 40)
    wo = ctx.tensor(f32(rng, 128, 32 * 6).astype(np.float16))
    y = gg.mul_mat(wo, flat)
    return (y, gg.scale(flat, 2.0)) if extra_reader else (y,)


def test_fold_casts_through_a_reshape_into_cont(rng, monkeypatch):
    """The cont writes the F16 GEMM operand itself although the cast reads it through a reshape."""
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    steps = gg.build_forward(*_heads_to_gemm(rng), backends=("cuda", "cpu")).plan.steps
    assert [(s.ops, s.kernel) for s in steps] == [(("cont", "cast"), "cpy_f32_f16"), (("mul_mat",), "cublas_gemm")]
    assert steps[0].out.dtype is gg.F16 and steps[0].out.ne[:2] == (192, 40)
    assert steps[0].inputs == (steps[0].nodes[0].src[0],)  # the permuted view; the reshape is inside


def test_fold_casts_not_through_a_reshape_read_twice(rng, monkeypatch):
    from gg.backends.cuda.families import matmul as support
    monkeypatch.setattr(support, "have_cublas", lambda: True)
    steps = gg.build_forward(*_heads_to_gemm(rng, extra_reader=True), backends=("cuda", "cpu")).plan.steps
    assert ("cont", "cast") not in [s.ops for s in steps] and ("cont",) in [s.ops for s in steps]


def _norm_then_matvec(rng, n=4096, rows=300, tokens=1, wdt=np.float16, consumers=1):
    ctx = gg.Context()
    x, w = ctx.tensor(f32(rng, tokens, n)), ctx.tensor(f32(rng, n))
    h = gg.mul(gg.rms_norm(x, 1e-5), w)
    outs = [gg.mul_mat(ctx.tensor(f32(rng, rows, n).astype(wdt)), h) for _ in range(consumers)]
    return outs


@pytest.mark.parametrize("n,kernel", [(4096, "mul_mat_vecw_norm_f16_f32"), (1024, "mul_mat_vecw128_norm_rows_f16_f32"),
                                      (576, "mul_mat_vecw64_norm_rows_f16_f32"),
                                      (256, "mul_mat_vecw32_norm_rows_f16_f32")])
def test_rms_norm_fuses_into_the_decode_matvec(rng, n, kernel):
    """One token: rms_norm * w -> W·h is one mat-vec step (plannable without a GPU); short rows
    (SmolLM2's 576) take a narrower block, each thread still with a 16-byte load, and more rows
    per block."""
    steps = gg.build_forward(*_norm_then_matvec(rng, n=n), backends=("cuda", "cpu")).plan.steps
    assert [(s.ops, s.kernel) for s in steps] == [(("rms_norm", "mul", "mul_mat"), kernel)]


@pytest.mark.parametrize("case", ["two tokens", "two products", "short rows", "odd rows"])
def test_rms_norm_stays_apart_from_other_matvecs(rng, case):
    kw = {"two tokens": dict(tokens=2), "two products": dict(consumers=2), "short rows": dict(n=128),
          "odd rows": dict(n=4100)}[case]
    steps = gg.build_forward(*_norm_then_matvec(rng, **kw), backends=("cuda", "cpu")).plan.steps
    assert ("rms_norm", "mul", "mul_mat") not in [s.ops for s in steps]
    if case == "two products":  # siblings of one row: one step normalizes for both (tests/test_siblings.py)
        assert [s.ops for s in steps] == [("rms_norm", "mul", "mul_mat", "mul_mat")]
        return
    assert [s.ops for s in steps][0] == ("rms_norm", "mul")
