"""The planner elides a `cont` whose one consumer reads the cont's source itself (gg/graph/elide.py).

Plans need no GPU. Where it is legal the cont step disappears (the consumer step lists it in
`elided`, the plan table and footer show it); where it is not (the source written in between,
the cont an output/kept/viewed/read twice, the consumer writing the source's memory, a slower
kind of kernel), the cont stays. CPU computes check elided == unfused == float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda.families import attention as attention_family, matmul
from reference_helpers import nmse

BOTH = ("cuda", "cpu")


def conts(plan) -> list:
    return [s for s in plan.steps if s.ops == ("cont",)]


def elided(plan) -> list:
    return [t for s in plan.steps for t in s.elided]


def attention(ctx, hd=128, n_kv=100, nh=8, nkv=2, T=1, n_ctx=128, cont=True, dtype=gg.F16):
    """llama.cpp's flash-attention layout: K and V caches (hd, n_ctx, n_kv_head), V read through
    transpose (and cont). Returns (out, the cont or None, the V cache)."""
    rng = np.random.default_rng(0)
    K = ctx.tensor(rng.standard_normal((nkv, n_ctx, hd)), dtype=dtype, name="k_cache")
    V = ctx.tensor(rng.standard_normal((nkv, n_ctx, hd)), dtype=dtype, name="v_cache")
    q = ctx.tensor(rng.standard_normal((T, nh, hd)).astype(np.float32), name="q")
    k = gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)
    v = gg.transpose(gg.view_3d(V, hd, n_kv, nkv, V.nb[1], V.nb[2], 0))
    c = gg.cont(v) if cont else None
    kq = gg.soft_max_ext(gg.mul_mat(k, gg.permute(q, 0, 2, 1, 3)), None, scale=hd ** -0.5)
    return gg.mul_mat(c if cont else v, kq), c, V


def test_cont_elided_into_the_flash_attention():
    out, c, _ = attention(gg.Context())
    plan = gg.build_forward(out, backends=BOTH).plan
    assert not conts(plan) and elided(plan) == [c], str(plan)
    (step,) = plan.steps
    assert step.kernel == attention_family.fast_symbol("f16", 4, 128, True, step.choice.chunk) and step.choice.v_pos
    assert step.srcs(out)[0] is c.src[0]  # reads the transposed cache view itself
    text = str(plan)
    assert "cont elided" in text and "1 cont elided" in plan.summary()


def test_generic_build_takes_position_major_v():
    out, c, _ = attention(gg.Context(), hd=80, n_kv=77)
    (step,) = gg.build_forward(out, backends=BOTH).plan.steps
    assert step.kernel == "flash_attn_f16_h1" and step.choice.v_pos and step.elided == (c,)


def test_no_fusion_keeps_the_cont():
    out, c, _ = attention(gg.Context())
    plan = gg.build_forward(out, backends=BOTH, fuse=False).plan
    assert [s.out for s in conts(plan)] == [c] and not elided(plan)


def test_kept_when_the_source_is_written_between():
    """cont(V^T) is taken, then V is written, then the consumer runs: reading V itself would see
    the new values."""
    ctx = gg.Context()
    out, c, V = attention(ctx)
    kq = out.src[1]
    new = ctx.tensor(np.ones((2, 128, 128), np.float16), name="new")
    w = gg.cpy(new, V)  # a dependency of the consumer's other operand: runs after the cont
    out2 = gg.mul_mat(c, gg.add(kq, gg.scale(gg.view_3d(gg.cont(w), 100, 1, 8, 200, 200, 0), 0.0)))
    plan = gg.build_forward(out2, backends=BOTH).plan
    order = [s.ops for s in plan.steps]
    assert order.index(("cont",)) < order.index(("cpy",)), str(plan)
    assert c in [s.out for s in conts(plan)] and c not in elided(plan), str(plan)


def test_kept_when_the_consumer_writes_the_source():
    ctx = gg.Context()
    X = ctx.tensor(np.arange(24, dtype=np.float32).reshape(4, 6), name="x")  # ne (6, 4)
    a = gg.view_2d(X, 3, 4, X.nb[1], 0)
    b = gg.view_2d(X, 3, 4, X.nb[1], 3 * 4)
    c = gg.cont(gg.transpose(gg.transpose(a)))
    w = gg.cpy(c, b)  # the copy's destination shares X with its source
    for be in (BOTH, ("cpu",)):
        plan = gg.build_forward(w, backends=be).plan
        assert not elided(plan) and len(conts(plan)) == 1, str(plan)


@pytest.mark.parametrize("why", ["output", "kept", "two readers", "read twice", "viewed"])
def test_kept_when_the_value_is_needed(why):
    ctx = gg.Context()
    x = ctx.tensor(np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32), name="x")
    c = gg.cont(gg.transpose(x))
    y = gg.scale(c, 2.0)
    outs, keep = [y], []
    if why == "output":
        outs.append(c)
    elif why == "kept":
        keep.append(c)
    elif why == "two readers":
        outs.append(gg.scale(c, 3.0))
    elif why == "read twice":
        outs = [gg.mul(c, c)]
    else:
        outs = [gg.scale(gg.reshape(c, 35), 2.0)]
    for be in (BOTH, ("cpu",)):
        plan = gg.build_forward(*outs, backends=be, keep=keep).plan
        assert len(conts(plan)) == 1 and not elided(plan), (why, str(plan))


def test_cont_of_a_cache_write_reads_the_written_view():
    """cont(cpy(x^T, h)): the consumer reads h's view after the write (order kept)."""
    ctx = gg.Context()
    x = ctx.tensor(np.ones((5, 8), np.float32), name="x")
    h = ctx.tensor(np.zeros((8, 5), np.float16), name="h")
    w = gg.cpy(gg.transpose(x), h)
    c = gg.cont(w)
    y = gg.scale(c, 2.0)
    plan = gg.build_forward(y, backends=BOTH).plan
    assert [s.ops for s in plan.steps] == [("cpy",), ("scale",)] and elided(plan) == [c], str(plan)
    assert plan.steps[1].srcs(y)[0] is w


def test_a_converting_cont_is_never_elided():
    """gg.cont keeps the dtype; a cont node of another dtype (none can be built through the API)
    would convert, and the pass leaves it alone."""
    x = gg.tensor(np.ones((5, 8), np.float32))
    c = gg.Tensor(gg.F16, (5, 8, 1, 1), op="cont", src=(gg.transpose(x),))
    plan = gg.build_forward(gg.scale(c, 2.0), backends=("cpu",)).plan
    assert len(conts(plan)) == 1 and not elided(plan)


def test_kept_before_a_gemm_that_would_leave_cublas(monkeypatch):
    """Prefill: cont + cuBLAS beats a strided fallback product; the decode step elides it."""
    monkeypatch.setattr(matmul, "have_cublas", lambda: True)
    out, c, _ = attention(gg.Context(), T=64)
    plan = gg.build_forward(out, backends=BOTH).plan
    last = plan.steps[-1]
    assert last.kernel.startswith("cublas") and c in [s.out for s in conts(plan)], str(plan)


def test_source_on_another_backend_gets_a_transfer():
    """The elided cont's source lives on the CPU: the consumer reads a transfer of it (which makes
    it contiguous: the transposed-cache build runs)."""
    out, c, V = attention(gg.Context(backend="cpu"), n_kv=104)  # transferred rows: 16-byte multiples
    plan = gg.build_forward(out, backends=BOTH).plan
    assert elided(plan) == [c] and not conts(plan), str(plan)
    flash = plan.steps[-1]
    (read,) = [flash.srcs(n)[0] for n in flash.nodes if n is out]
    assert read.op == "transfer" and read.src[0] is c.src[0] and flash.kernel == attention_family.fast_symbol("f16", 4, 128, False, flash.choice.chunk)


def test_cpu_elided_equals_unfused_and_reference():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 13))
    b = rng.standard_normal((13, 9))
    x, y = gg.tensor(a.astype(np.float32)), gg.tensor(b.astype(np.float32))
    out = gg.add(gg.cont(gg.transpose(x)), y)
    g = gg.build_forward(out, backends=("cpu",))
    assert len(elided(g.plan)) == 1 and not conts(g.plan)
    g.compute()
    got = out.numpy()
    plain = gg.build_forward(out, backends=("cpu",), fuse=False)
    plain.compute()
    assert np.array_equal(got, out.numpy())
    assert nmse(got, a.T + b) <= 1e-7


def test_cpu_written_between_stays_right():
    """The graph of test_kept_when_the_source_is_written_between, computed: the consumer sees V
    as it was before the write (the cont's copy)."""
    ctx = gg.Context(backend="cpu")
    rng = np.random.default_rng(3)
    v0 = rng.standard_normal((4, 6)).astype(np.float32)
    V = ctx.tensor(v0.copy(), name="v")
    new = ctx.tensor(np.full((4, 6), 5.0, np.float32), name="new")
    c = gg.cont(gg.transpose(V))
    w = gg.cpy(new, V)
    out = gg.add(c, gg.scale(gg.cont(gg.transpose(w)), 0.0))
    g = gg.build_forward(out, backends=("cpu",))
    assert c in [s.out for s in conts(g.plan)], str(g.plan)
    g.compute()
    assert np.array_equal(out.numpy(), v0.T)


@pytest.mark.parametrize("backends", [("cpu",), ("cudalike", "cpu")])
def test_a_cont_of_an_elided_cont_reads_the_first_ones_source(backends):
    """cont(cont(x)) before its one reader (the fuzzer's find): the first cont elided into the
    second, the second into the reader, which reads x itself; both listed, the values unchanged."""
    import cuda_shaped_backend  # noqa: F401 - registers "cudalike"
    rng = np.random.default_rng(4)
    a = rng.standard_normal((7, 5))
    x = gg.tensor(a.astype(np.float32))
    for src, m in ((x, a), (gg.transpose(x), a.T)):  # ggml's mul_mat(A, B): B @ A.T in numpy terms
        b = rng.standard_normal((3, m.shape[1]))
        out = gg.mul_mat(gg.cont(gg.cont(src)), gg.tensor(b.astype(np.float32)))
        g = gg.build_forward(out, backends=backends)
        assert len(elided(g.plan)) == 2 and not conts(g.plan), str(g.plan)
        (step,) = [s for s in g.plan.steps if s.elided]
        assert step.srcs(out)[0] is src
        g.compute()
        got = out.numpy()
        assert nmse(got, b @ m.T) <= 1e-7
        plain = gg.build_forward(out, backends=backends, fuse=False)
        plain.compute()
        assert np.array_equal(got, out.numpy())
