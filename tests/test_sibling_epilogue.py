"""The sibling step's epilogue (gg/graph/fuse.py fuse_epilogues run after gg/graph/siblings.py,
families/siblings.py SibEpilogue, kernels/siblings.cu SibEpi): llama.cpp's decode block with
separate Wq, Wk, Wv also ropes q and k and writes K and V into the caches (`cpy` into a view at
n_past, or `set_rows`) in the one launch of the three products, as gg.llama's stacked wqkv does;
with float weights (kernels/siblings.cu) and block-quantized ones (kernels/quant.cu) alike.
Planning needs no GPU; on a GPU the results are checked against float64 references and, bit for
bit, against the same plan with the rope and the writes as steps of their own."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda.families import siblings
from reference import ref_mul_mat, ref_rms_norm, ref_rope
from reference_helpers import nmse, nmse_vs_reference
from test_quant_ops import random_weights

cuda = pytest.mark.cuda
PRODUCTS = ("rms_norm", "mul", "mul_mat", "mul_mat", "mul_mat")
NEOX, NORMAL = gg.ROPE_NEOX, gg.ROPE_NORMAL


def rand(rng, *shape):
    return (rng.standard_normal(shape) + 0.1).astype(np.float32)


def _block(ctx, rng, *, K=512, hd=64, nh=6, nkv=2, mode=NEOX, write="cpy", n_dims=None, n_past=13, n_ctx=40,
           wdt=gg.F16, kdt=gg.F16, vdt=gg.F16, k_reader=False, shared_weights=False):
    """One decode token of llama.cpp's block up to the cache writes: q, k, v = Wq·h, Wk·h, Wv·h with
    h = rms_norm(x) * w; q and k roped over n_dims of each head; k and v into row n_past of the
    position-major caches K, V (hd, n_ctx, nkv); out = 2 * q (a later reader of q).
    k_reader: a node reads the roped k before its cache write. shared_weights: Wk is a view of a
    persistent tensor that the K write also writes into (after Wk's rows)."""
    n_dims = hd if n_dims is None else n_dims
    x, nw = ctx.tensor(rand(rng, 1, K) * 3.0), ctx.tensor(rand(rng, K))

    def weights(rows):
        if wdt.is_quantized:  # random blocks (gg quantizes only Q8_0/Q4_0/Q4_1)
            return random_weights(rng, wdt, rows, K, ctx)
        return ctx.tensor(rand(rng, rows, K), dtype=wdt)

    Wq, Wv = weights(nh * hd), weights(nkv * hd)
    if shared_weights:
        Wall = ctx.new_tensor(wdt, (K, 2 * nkv * hd), persistent=True)
        Wall.set(rand(rng, 2 * nkv * hd, K))
        Wk = gg.view_2d(Wall, K, nkv * hd, Wall.nb[1], 0)
    else:
        Wk = weights(nkv * hd)
    h = gg.mul(gg.rms_norm(x, 1e-5), nw)
    pos = ctx.tensor(np.array([n_past], np.int32))
    q = gg.rope(gg.reshape(gg.mul_mat(Wq, h), hd, nh, 1), pos, n_dims, mode=mode)
    k = gg.rope(gg.reshape(gg.mul_mat(Wk, h), hd, nkv, 1), pos, n_dims, mode=mode)
    v = gg.reshape(gg.mul_mat(Wv, h), hd, nkv, 1)
    Kc = ctx.new_tensor(kdt, (hd, n_ctx, nkv), persistent=True)
    Vc = ctx.new_tensor(vdt, (hd, n_ctx, nkv), persistent=True)
    Kc.set(rand(rng, nkv, n_ctx, hd))
    Vc.set(rand(rng, nkv, n_ctx, hd))
    g = gg.Graph(backends=("cuda", "cpu"))
    extra = []
    if k_reader:
        extra.append(gg.scale(k, 3.0))
        g.build_forward_expand(extra[-1])
    idx = ctx.tensor(np.array([n_past], np.int32))
    for src, cache in ((k, Kc), (v, Vc)):
        if shared_weights and cache is Kc:
            g.build_forward_expand(gg.cpy(src, gg.view_1d(Wall, hd * nkv, nkv * hd * Wall.nb[1])))
        elif write == "cpy":
            g.build_forward_expand(gg.cpy(src, gg.view_3d(cache, hd, nkv, 1, cache.nb[2], cache.nb[1],
                                                          n_past * cache.nb[1])))
        else:
            g.build_forward_expand(gg.set_rows(cache, gg.permute(src, 0, 2, 1, 3), idx))
    out = gg.scale(q, 2.0)
    g.build_forward_expand(out)
    parts = dict(x=x, nw=nw, Wq=Wq, Wk=Wk, Wv=Wv, K=Kc, V=Vc, out=out, hd=hd, nh=nh, nkv=nkv, mode=mode,
                 n_dims=n_dims, n_past=n_past, idx=idx, extra=extra)
    return g, parts


def _epi_step(plan):
    return next(s for s in plan.steps if s.ops[:len(PRODUCTS)] == PRODUCTS)


# ---- the plan (no GPU) --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [NORMAL, NEOX])
@pytest.mark.parametrize("write", ["cpy", "set_rows"])
@pytest.mark.parametrize("nkv", [6, 2, 1])  # MHA, GQA, MQA
def test_products_rope_and_write_in_one_step(rng, mode, write, nkv):
    g, p = _block(gg.Context(), rng, mode=mode, write=write, nkv=nkv)
    plan = g.plan
    assert [s.ops for s in plan.steps] == [PRODUCTS + ("rope", write, write, "rope"), ("scale",)]
    first = plan.steps[0]
    assert first.kernel == "mul_mat_sib_norm_epi_f16_f32_narrow"  # K = 512: 64-thread blocks of 2 rows
    assert [r[5] for r in first.choice.ropes] == [int(mode == NEOX)] * 2
    rope_k, write_k, write_v, rope_q = first.nodes[5:]
    # q leaves the step (scale reads it); the products and the roped k are read inside only
    assert rope_q is first.out and rope_q in plan.alloc.offsets
    assert rope_k not in first.exports and rope_k not in plan.alloc.offsets
    assert not any(n in plan.alloc.offsets for n in first.nodes[2:5])
    assert {write_k.root, write_v.root} == {p["K"], p["V"]}


QUANT = [gg.Q8_0, gg.Q4_0, gg.Q4_1, gg.Q4_K, gg.Q6_K]


@pytest.fixture
def quant_epilogue(monkeypatch):
    """The epilogue on quantized weights: built and tested, off in plans (siblings.QUANT_EPILOGUE)."""
    monkeypatch.setattr(siblings, "QUANT_EPILOGUE", True)


def test_quantized_weights_keep_the_epilogue_off_by_default(rng):
    g, _ = _block(gg.Context(), rng, wdt=gg.Q4_0, K=512, hd=64)
    # (matrices this small take the build of fewer rows a block, blocks.SIB_SMALL_ROWS)
    assert g.plan.steps[0].ops == PRODUCTS and g.plan.steps[0].kernel == "mul_mat_sibq_norm_q4_0_f32_qx_small"


@pytest.mark.parametrize("mode", [NORMAL, NEOX])
@pytest.mark.parametrize("write", ["cpy", "set_rows"])
@pytest.mark.parametrize("wdt", [gg.Q4_0, gg.Q8_0])
def test_epilogue_ops_a_product_does_not_take_are_one_step(rng, mode, write, wdt, monkeypatch):
    """Quantized Wq/Wk/Wv (the products' step has no epilogue): rope(k), the two writes and rope(q)
    become one step of their own right after the products (fuse_epilogue_steps, EpiRows), reading
    the k, v and q vectors in that order; the roped k stays inside it, q leaves it. Without
    siblings.EPI_STEP, four steps."""
    g, p = _block(gg.Context(), rng, wdt=wdt, mode=mode, write=write, K=512, hd=64, nh=6, nkv=2)
    plan = g.plan
    assert [s.ops for s in plan.steps] == [PRODUCTS, ("rope", write, write, "rope"), ("scale",)]
    epi = plan.steps[1]
    assert epi.kernel == "sib_epilogue_rows_f32" and epi.choice.members == (128, 128, 384)
    rope_k, write_k, write_v, rope_q = epi.nodes
    assert rope_q is epi.out and rope_k not in epi.exports and rope_k not in plan.alloc.offsets
    assert {write_k.root, write_v.root} == {p["K"], p["V"]}
    monkeypatch.setattr(siblings, "EPI_STEP", False)
    g, _ = _block(gg.Context(), rng, wdt=wdt, mode=mode, write=write, K=512, hd=64, nh=6, nkv=2)
    assert [s.ops for s in g.plan.steps] == [PRODUCTS, ("rope",), (write,), (write,), ("rope",), ("scale",)]


def _stacked(ctx, rng, *, wdt=gg.Q4_0, K=512, hd=64, nh=6, nkv=2, mode=NEOX, n_past=9, n_ctx=24, one_rope=False):
    """gg.llama's layout with a user's ops: one stacked QKV product (quantized), q and k roped as
    views of it (one rope over both when `one_rope`, as a GGUF model's plan has it), k and v
    written with set_rows into position-major caches; out = 2 * q."""
    x, nw = ctx.tensor(rand(rng, 1, K) * 3.0), ctx.tensor(rand(rng, K))
    W = random_weights(rng, wdt, (nh + 2 * nkv) * hd, K, ctx)
    qkv = gg.mul_mat(W, gg.mul(gg.rms_norm(x, 1e-5), nw))
    pos = ctx.tensor(np.array([n_past], np.int32))
    f = qkv.nb[0]
    if one_rope:
        qk = gg.rope(gg.view_3d(qkv, hd, nh + nkv, 1, hd * f, hd * (nh + nkv) * f, 0), pos, hd, mode=mode)
        q = gg.view_3d(qk, hd, nh, 1, qk.nb[1], qk.nb[2], 0)
        k = gg.view_3d(qk, hd, nkv, 1, qk.nb[1], qk.nb[2], nh * hd * f)
    else:
        q = gg.rope(gg.view_3d(qkv, hd, nh, 1, hd * f, hd * nh * f, 0), pos, hd, mode=mode)
        k = gg.rope(gg.view_3d(qkv, hd, nkv, 1, hd * f, hd * nkv * f, nh * hd * f), pos, hd, mode=mode)
    v = gg.view_3d(qkv, hd, nkv, 1, hd * f, hd * nkv * f, (nh + nkv) * hd * f)
    Kc, Vc = (ctx.new_tensor(gg.F16, (hd, n_ctx, nkv), persistent=True) for _ in range(2))
    Kc.set(rand(rng, nkv, n_ctx, hd))
    Vc.set(rand(rng, nkv, n_ctx, hd))
    idx = ctx.tensor(np.array([n_past], np.int32))
    g = gg.Graph(backends=("cuda", "cpu"))
    for src, cache in ((k, Kc), (v, Vc)):
        g.build_forward_expand(gg.set_rows(cache, gg.permute(src, 0, 2, 1, 3), idx))
    out = gg.scale(gg.cont(q), 2.0)
    g.build_forward_expand(out)
    return g, dict(K=Kc, V=Vc, out=out, idx=idx, hd=hd, nkv=nkv)


@pytest.mark.parametrize("one_rope", [False, True])
def test_stacked_qkv_ropes_and_writes_are_one_step(rng, one_rope):
    """A stacked quantized QKV: its ropes (of q and of k, disjoint rows of one vector, or one rope
    of both) and the writes read one member vector."""
    g, _ = _stacked(gg.Context(), rng, one_rope=one_rope)
    ops = [s.ops for s in g.plan.steps]
    assert ops[0] == ("rms_norm", "mul", "mul_mat")
    epi = g.plan.steps[1]
    assert epi.kernel == "sib_epilogue_rows_f32" and epi.choice.members == ((6 + 4) * 64,)
    assert epi.ops == (("rope", "set_rows", "set_rows") if one_rope else ("rope", "set_rows", "set_rows", "rope"))


@pytest.mark.parametrize("wdt", QUANT)
@pytest.mark.parametrize("mode", [NORMAL, NEOX])
def test_quantized_products_rope_and_write_in_one_step(rng, wdt, mode, quant_epilogue):
    """Block-quantized Wq/Wk/Wv: the quantized sibling mat-vec takes the rope and the writes too.
    A block holds `per` rows (families/blocks.py matvec_rows: K = 512 gives 16-32, Q6_K 24): NEOX
    pairs (i, i + 32) of a 64-row head fall in one block as epi_rows lays them out only when per
    divides head_dim and n_dims; otherwise the rope and the writes stay steps of their own."""
    g, _ = _block(gg.Context(), rng, wdt=wdt, mode=mode, K=512, hd=64, write="set_rows")
    first = g.plan.steps[0]
    assert first.choice.quant and first.choice.per % 2 == 0
    if mode == NEOX and 64 % first.choice.per:
        assert first.ops == PRODUCTS and first.kernel.startswith(f"mul_mat_sibq_norm_{wdt.name}_f32")
        return
    assert first.ops == PRODUCTS + ("rope", "set_rows", "set_rows", "rope")
    assert first.kernel.startswith(f"mul_mat_sibq_norm_epi_{wdt.name}_f32")


def test_quantized_neox_whose_pairs_leave_the_block_stays_a_step(rng, quant_epilogue):
    """K = 576 (SmolLM2): 3 row groups of 4 (blocks.SIB_SMALL_ROWS) share a Q4_0 block, 12 rows that
    do not divide a 64-row head: NEOX keeps its rope a step, NORMAL (pairs of adjacent rows) takes
    the epilogue build of the same rows."""
    g, _ = _block(gg.Context(), rng, wdt=gg.Q4_0, mode=NEOX, K=576, hd=64)
    assert g.plan.steps[0].choice.per == 12 and g.plan.steps[0].kernel.endswith("_small")
    # (they join no product: the epilogue step of their own takes them, siblings.EPI_STEP)
    assert [s.ops for s in g.plan.steps] == [PRODUCTS, ("rope", "cpy", "cpy", "rope"), ("scale",)]
    assert g.plan.steps[1].kernel == "sib_epilogue_rows_f32"
    g, _ = _block(gg.Context(), rng, wdt=gg.Q4_0, mode=NORMAL, K=576, hd=64)
    assert g.plan.steps[0].ops == PRODUCTS + ("rope", "cpy", "cpy", "rope")
    assert g.plan.steps[0].choice.per == 12 and g.plan.steps[0].kernel == "mul_mat_sibq_norm_epi_q4_0_f32_qx_small"


@pytest.mark.parametrize("mode,hd,n_dims,per,kernel", [
    (NORMAL, 64, 64, 8, "mul_mat_sib_norm_epi_f16_f32"),
    (NEOX, 128, 64, 8, "mul_mat_sib_norm_epi_f16_f32"),          # 8 rows divide head_dim and n_dims
    (NEOX, 48, 20, 2, "mul_mat_sib_norm_epi_f16_f32_narrow"),    # ... and here they do not
])
def test_long_rows_take_the_wide_build_where_its_rows_tile_the_ropes(rng, mode, hd, n_dims, per, kernel):
    """K = 2048 F16: 256-thread blocks, siblings.EPI_ROWS rows each where every rope pair falls in a
    block of them, else the narrow build's 2 (the epilogue is kept either way)."""
    g, _ = _block(gg.Context(), rng, mode=mode, hd=hd, n_dims=n_dims, nh=4, nkv=2, K=2048)
    first = g.plan.steps[0]
    assert first.ops == PRODUCTS + ("rope", "cpy", "cpy", "rope")
    assert (first.kernel, first.choice.per, first.choice.threads) == (kernel, per, siblings.THREADS)
    assert per in (siblings.EPI_ROWS, siblings.EPI_NARROW_ROWS)


def test_the_forms_of_issue_20_are_three_steps():
    import forms as F
    base = F.Dims(n_embd=512, n_head=8, n_head_kv=8, n_ff=64, n_ctx=64)
    x = np.random.default_rng(0).standard_normal(base.n_embd).astype(np.float32)
    for name in ("llama.cpp", "v-cont", "diag-mask", "set-rows", "gqa", "mqa", "add-mm-x", "mask-f16"):
        f = F.FORMS[name]
        d = f.dims(base)
        k, v = F.make_cache_rows(d)
        b = F.build(f, base, 7, F.make_arrays(d, ffn=False), k, v, x, backends=("cuda", "cpu"))
        n, syms = F.plan_summary(b.graph)
        assert n == 3 and syms[0] == "mul_mat_sib_norm_epi_f16_f32_narrow", (name, syms)
        b.free()


def test_not_without_fusion_or_the_declared_ops(rng, monkeypatch):
    g, _ = _block(gg.Context(), rng)
    g.fuse = False
    assert not any("rope" in s.ops and len(s.ops) > 1 for s in g.plan.steps)
    monkeypatch.setattr(siblings, "EPILOGUE_OPS", ())
    g, _ = _block(gg.Context(), rng)
    assert [s.ops for s in g.plan.steps] == [PRODUCTS, ("rope",), ("cpy",), ("cpy",), ("rope",), ("scale",)]


def test_more_products_than_the_epilogue_builds_take_keep_their_epilogue_ops_as_steps(rng, monkeypatch):
    """The float epilogue builds have siblings.EPI_MAX_MEMBERS member slots (SIB_EPI_MAX): a step of
    more products keeps the plain sibling build, its ropes and writes steps of their own."""
    monkeypatch.setattr(siblings, "EPI_MAX_MEMBERS", 3)
    g, _ = _block(gg.Context(), rng)
    assert _epi_step(g.plan).kernel == "mul_mat_sib_norm_epi_f16_f32_narrow"
    monkeypatch.setattr(siblings, "EPI_MAX_MEMBERS", 2)
    g, _ = _block(gg.Context(), rng)
    # the epilogue step of their own reads as many vectors: rope(k), the writes (k, v), not rope(q)
    assert [s.ops for s in g.plan.steps] == [PRODUCTS, ("rope", "cpy", "cpy"), ("rope",), ("scale",)]
    assert g.plan.steps[0].kernel == "mul_mat_sib_norm_f16_f32"
    assert g.plan.steps[1].kernel == "sib_epilogue_rows_f32" and g.plan.steps[1].choice.members == (128, 128)
    monkeypatch.setattr(siblings, "EPI_STEP", False)
    g, _ = _block(gg.Context(), rng)
    assert [s.ops for s in g.plan.steps] == [PRODUCTS, ("rope",), ("cpy",), ("cpy",), ("rope",), ("scale",)]


def test_rope_read_before_its_write_is_stored(rng):
    """A node reading the roped k sits between the rope and the K write: the writes and rope(q)
    move up past it (it reads only the roped k, which the step now stores for it)."""
    g, p = _block(gg.Context(), rng, k_reader=True)
    plan = g.plan
    assert [s.ops for s in plan.steps] == [PRODUCTS + ("rope", "cpy", "cpy", "rope"), ("scale",), ("scale",)]
    rope_k = plan.steps[0].nodes[5]
    assert rope_k in plan.steps[0].exports and rope_k in plan.alloc.offsets
    assert p["extra"][0].src[0] is rope_k


def test_a_step_in_between_that_reads_the_cache_keeps_the_write_a_step(rng):
    """A `cont(transpose(V))` built before the V write: the write may not move up past it (the
    cont reads the V the write leaves alone), and what follows the write keeps its order. (v-cont's
    cont comes after both writes: rope(q) moves up past it, test_the_forms_of_issue_20_...)"""
    ctx = gg.Context()
    g, p = _block(ctx, rng)
    plan = g.plan
    assert [s.ops for s in plan.steps][0] == PRODUCTS + ("rope", "cpy", "cpy", "rope")
    g2 = gg.Graph(backends=("cuda", "cpu"))
    k_write, v_write = plan.steps[0].nodes[6:8]
    reads_v = gg.cont(gg.transpose(p["V"]))
    for t in (k_write, reads_v, v_write, p["out"]):
        g2.build_forward_expand(t)
    ops = [s.ops for s in g2.plan.steps]
    assert ops == [PRODUCTS + ("rope", "cpy"), ("cont",), ("cpy",), ("rope",), ("scale",)]


def test_a_write_into_what_a_product_reads_stays_a_step(rng):
    """The K write goes into the tensor Wk is a view of: its blocks would race the blocks still
    reading Wk, so it (and the V write that follows it) stays out; the rope still joins."""
    g, _ = _block(gg.Context(), rng, shared_weights=True)
    ops = [s.ops for s in g.plan.steps]
    assert ops[0] == PRODUCTS + ("rope",) and ops[1:3] == [("cpy",), ("cpy",)]


@pytest.mark.parametrize("mode", [NORMAL, NEOX])
def test_odd_head_rows_keep_the_rope_a_step(rng, mode):
    """head_dim 7: a rotated pair would straddle two blocks."""
    g, _ = _block(gg.Context(), rng, mode=mode, hd=7, n_dims=6, nh=8, nkv=8)
    ops = [s.ops for s in g.plan.steps]
    assert ops[0] == PRODUCTS and ("rope",) in ops


def test_rope_of_rows_at_an_odd_offset_stays_a_step(rng):
    ctx = gg.Context()
    x = ctx.tensor(rand(rng, 1, 256))
    W1, W2 = ctx.tensor(rand(rng, 130, 256), dtype=gg.F16), ctx.tensor(rand(rng, 64, 256), dtype=gg.F16)
    a, b = gg.mul_mat(W1, x), gg.mul_mat(W2, x)
    pos = ctx.tensor(np.array([3], np.int32))
    r = gg.rope(gg.view_3d(a, 64, 2, 1, 256, 520, 4), pos, 64, mode=NEOX)  # rows 1..128 of a
    plan = gg.build_forward(gg.scale(r, 1.0), gg.scale(b, 1.0), backends=("cuda", "cpu")).plan
    assert [s.ops for s in plan.steps][:2] == [("mul_mat", "mul_mat"), ("rope",)]


@pytest.mark.compile_all
def test_the_launch_fits_the_kernel_signature(rng, quant_epilogue):
    from test_kernel_contract import _lowered, mismatch
    graphs = [_block(gg.Context(), rng, mode=m, write=w, wdt=t)[0]
              for m, w, t in ((NORMAL, "cpy", gg.F16), (NEOX, "set_rows", gg.F32), (NEOX, "cpy", gg.BF16),
                              (NEOX, "cpy", gg.Q4_0), (NORMAL, "set_rows", gg.Q6_K))]
    assert all(_epi_step(g.plan).kernel.startswith(("mul_mat_sib_norm_epi_", "mul_mat_sibq_norm_epi_"))
               for g in graphs)
    rt, records = _lowered(graphs)
    assert any("_epi_" in r.name for r in records)
    problems = [m for r in records if (m := mismatch(rt, r))]
    assert not problems, "\n".join(problems)


# ---- on the GPU ---------------------------------------------------------------------------------
def _reference(p):
    xs = p["x"].numpy().astype(np.float64)
    h = (ref_rms_norm(xs, 1e-5) * p["nw"].numpy()).astype(np.float32)
    hd, nh, nkv, pos = p["hd"], p["nh"], p["nkv"], np.array([p["n_past"]])
    q = ref_rope(ref_mul_mat(p["Wq"].numpy(), h).reshape(1, nh, hd), pos, p["n_dims"], mode=p["mode"])
    k = ref_rope(ref_mul_mat(p["Wk"].numpy(), h).reshape(1, nkv, hd), pos, p["n_dims"], mode=p["mode"])
    v = ref_mul_mat(p["Wv"].numpy(), h).reshape(nkv, hd)
    return 2.0 * q.reshape(nh, hd), k.reshape(nkv, hd), v


def _caches(p):
    """K and V as numpy (nkv, n_ctx, hd) (numpy() drops a trailing unit dim: one KV head)."""
    return [p[c].numpy().reshape(p["nkv"], -1, p["hd"]).copy() for c in ("K", "V")]


def _run(g, p):
    g.compute()
    return [p["out"].numpy().copy(), *_caches(p)]


@cuda
@pytest.mark.parametrize("mode,write,wdt,kdt,vdt,hd,n_dims,nh,nkv,n_past,K", [
    (NEOX, "cpy", gg.F16, gg.F16, gg.F16, 64, 64, 8, 2, 13, 512),
    (NORMAL, "cpy", gg.F16, gg.F16, gg.F16, 64, 64, 8, 8, 13, 512),
    (NEOX, "set_rows", gg.F16, gg.F16, gg.F16, 128, 128, 4, 1, 4095 % 40, 1024),
    (NORMAL, "set_rows", gg.F32, gg.F32, gg.F16, 64, 32, 6, 2, 39, 520),     # rope of half of each head
    (NEOX, "cpy", gg.BF16, gg.F32, gg.BF16, 48, 22, 6, 3, 27, 264),        # n_dims / 2 odd, odd position
    (NEOX, "set_rows", gg.F16, gg.BF16, gg.F32, 96, 6, 5, 5, 1, 776),      # pairs (0, 3) (1, 4) (2, 5)
    # the wide build (256 threads, siblings.EPI_ROWS rows a block): NEOX pair slots 4 at a time
    (NEOX, "cpy", gg.F16, gg.F16, gg.F16, 128, 128, 4, 2, 29, 2048),
    (NORMAL, "set_rows", gg.F16, gg.F16, gg.F16, 62, 62, 3, 1, 31, 2056),   # 186 rows: a partial last block
    (NEOX, "set_rows", gg.F32, gg.F32, gg.F16, 128, 64, 3, 1, 5, 1032),    # rope of half of each head, MQA
    (NEOX, "cpy", gg.BF16, gg.F16, gg.F16, 48, 20, 6, 3, 11, 4096),        # 8 rows leave the pairs: narrow
])
def test_matches_reference_and_the_steps_apart(rng, monkeypatch, mode, write, wdt, kdt, vdt, hd, n_dims, nh, nkv,
                                               n_past, K):
    ctx = gg.Context()
    g, p = _block(ctx, rng, mode=mode, write=write, wdt=wdt, kdt=kdt, vdt=vdt, hd=hd, n_dims=n_dims, nh=nh,
                  nkv=nkv, n_past=n_past, K=K)
    K0, V0 = _caches(p)
    assert g.plan.steps[0].ops == PRODUCTS + ("rope", write, write, "rope")
    got = _run(g, p)
    q, k, v = _reference(p)
    assert nmse(got[0], q) <= 1e-7
    for cache, before, want, dt in ((got[1], K0, k, kdt), (got[2], V0, v, vdt)):
        assert nmse(cache[:, n_past].astype(np.float64), want) <= (1e-7 if dt is gg.F32 else 1e-5)
        keep = np.ones(cache.shape[1], bool)
        keep[n_past] = False
        assert np.array_equal(cache[:, keep], before[:, keep])  # rows not written keep their bits

    # the same plan with the rope and both writes as their own steps: the same bits
    p["K"].set(K0.reshape(p["K"].numpy().shape)), p["V"].set(V0.reshape(p["V"].numpy().shape))
    monkeypatch.setattr(siblings, "EPILOGUE_OPS", ())
    g2 = gg.build_forward(*g.outputs, backends=("cuda", "cpu"))
    assert [s.ops for s in g2.plan.steps][:2] == [PRODUCTS, ("rope",)]
    apart = _run(g2, p)
    for a, b in zip(got, apart):
        assert np.array_equal(a, b)


@cuda
@pytest.mark.parametrize("wdt,mode,write,hd,n_dims,nh,nkv,K", [
    (gg.Q4_0, NEOX, "cpy", 128, 128, 4, 2, 1024),      # 8 rows a block: pair slots 4 at a time
    (gg.Q4_0, NORMAL, "set_rows", 64, 64, 6, 2, 576),  # 3 row groups of 4 a block (K / 8 = 72 threads each)
    (gg.Q4_1, NORMAL, "cpy", 64, 64, 9, 3, 576),       # SmolLM2's heads, the _small build
    (gg.Q4_1, NEOX, "set_rows", 64, 32, 4, 4, 512),    # rope of half of each head
    (gg.Q8_0, NEOX, "cpy", 64, 64, 8, 1, 512),         # 4 rows a block, MQA
    (gg.Q8_0, NORMAL, "cpy", 48, 48, 6, 3, 320),
    (gg.Q4_K, NEOX, "set_rows", 64, 64, 4, 2, 512),
    (gg.Q6_K, NORMAL, "cpy", 96, 96, 3, 1, 768),        # 6 rows a block
])
def test_quantized_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, mode, write, hd, n_dims, nh, nkv, K,
                                                         quant_epilogue):
    ctx = gg.Context()
    g, p = _block(ctx, rng, mode=mode, write=write, wdt=wdt, hd=hd, n_dims=n_dims, nh=nh, nkv=nkv, n_past=17,
                  K=K)
    K0, V0 = _caches(p)
    assert g.plan.steps[0].kernel.startswith("mul_mat_sibq_norm_epi_")
    got = _run(g, p)
    q, k, v = _reference(p)
    bound = nmse_vs_reference(g)
    assert nmse(got[0], q) <= bound
    for cache, before, want in ((got[1], K0, k), (got[2], V0, v)):
        assert nmse(cache[:, 17].astype(np.float64), want) <= max(bound, 1e-5)  # F16 caches
        keep = np.ones(cache.shape[1], bool)
        keep[17] = False
        assert np.array_equal(cache[:, keep], before[:, keep])

    p["K"].set(K0.reshape(p["K"].numpy().shape)), p["V"].set(V0.reshape(p["V"].numpy().shape))
    monkeypatch.setattr(siblings, "EPILOGUE_OPS", ())
    g2 = gg.build_forward(*g.outputs, backends=("cuda", "cpu"))
    assert g2.plan.steps[0].kernel.startswith("mul_mat_sibq_norm_") and g2.plan.steps[0].ops == PRODUCTS
    apart = _run(g2, p)
    for a, b in zip(got, apart):
        assert np.array_equal(a, b)


@cuda
@pytest.mark.parametrize("wdt,mode,write,hd,n_dims,nh,nkv,K,kdt,vdt", [
    (gg.Q4_0, NEOX, "cpy", 128, 128, 4, 2, 1024, gg.F16, gg.F16),
    (gg.Q4_1, NORMAL, "set_rows", 64, 64, 9, 3, 576, gg.F16, gg.F16),    # SmolLM2's heads
    (gg.Q4_1, NEOX, "set_rows", 64, 64, 9, 3, 576, gg.F16, gg.F16),      # pairs leave the products' blocks
    (gg.Q8_0, NEOX, "set_rows", 64, 32, 4, 4, 512, gg.F32, gg.BF16),     # rope of half of each head
    (gg.Q8_0, NORMAL, "cpy", 48, 22, 6, 1, 320, gg.F16, gg.F32),         # n_dims / 2 odd, MQA
    (gg.Q6_K, NEOX, "cpy", 96, 6, 3, 3, 768, gg.F16, gg.F16),            # pairs (0, 3) (1, 4) (2, 5)
])
def test_epilogue_step_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, mode, write, hd, n_dims, nh, nkv,
                                                             K, kdt, vdt):
    """The epilogue as a step of its own (sib_epilogue_rows_f32) after quantized products: q and the
    written cache rows against float64, the other rows untouched, and the same bits as the rope
    and the writes as steps of their own (siblings.EPI_STEP off)."""
    ctx = gg.Context()
    g, p = _block(ctx, rng, mode=mode, write=write, wdt=wdt, hd=hd, n_dims=n_dims, nh=nh, nkv=nkv, n_past=17, K=K,
                  kdt=kdt, vdt=vdt)
    K0, V0 = _caches(p)
    assert g.plan.steps[1].kernel == "sib_epilogue_rows_f32"
    got = _run(g, p)
    q, k, v = _reference(p)
    bound = nmse_vs_reference(g)
    assert nmse(got[0], q) <= bound
    for cache, before, want in ((got[1], K0, k), (got[2], V0, v)):
        assert nmse(cache[:, 17].astype(np.float64), want) <= max(bound, 1e-5)  # F16 / BF16 caches
        keep = np.ones(cache.shape[1], bool)
        keep[17] = False
        assert np.array_equal(cache[:, keep], before[:, keep])

    p["K"].set(K0.reshape(p["K"].numpy().shape)), p["V"].set(V0.reshape(p["V"].numpy().shape))
    monkeypatch.setattr(siblings, "EPI_STEP", False)
    g2 = gg.build_forward(*g.outputs, backends=("cuda", "cpu"))
    assert [s.ops for s in g2.plan.steps][1] == ("rope",)
    apart = _run(g2, p)
    for a, b in zip(got, apart):
        assert np.array_equal(a, b)


@cuda
@pytest.mark.parametrize("one_rope", [False, True])
def test_stacked_epilogue_step_equals_the_steps_apart(rng, monkeypatch, one_rope):
    """The stacked QKV's epilogue step (two ropes of one vector, or one rope of both q and k): the
    same bits as the steps apart; an index out of range is an error that writes nothing."""
    got = {}
    for on in (True, False):
        monkeypatch.setattr(siblings, "EPI_STEP", on)
        g, p = _stacked(gg.Context(), np.random.default_rng(7), one_rope=one_rope)
        assert (g.plan.steps[1].kernel == "sib_epilogue_rows_f32") == on
        g.compute()
        got[on] = [p["out"].numpy().copy(), p["K"].numpy().copy(), p["V"].numpy().copy()]
    for a, b in zip(got[True], got[False]):
        assert np.array_equal(a, b)
    monkeypatch.setattr(siblings, "EPI_STEP", True)
    g, p = _stacked(gg.Context(), rng, one_rope=one_rope, n_ctx=24)
    p["idx"].set(np.array([24], np.int32))
    K0 = p["K"].numpy().copy()
    with pytest.raises(gg.BackendError, match="out of range"):
        g.compute()
    assert np.array_equal(p["K"].numpy(), K0)


@cuda
def test_an_index_out_of_range_is_an_error_and_writes_nothing(rng):
    ctx = gg.Context()
    g, p = _block(ctx, rng, write="set_rows", n_ctx=40)
    p["idx"].set(np.array([40], np.int32))
    K0 = p["K"].numpy().copy()
    with pytest.raises(gg.BackendError, match="out of range"):
        g.compute()
    assert np.array_equal(p["K"].numpy(), K0)
    p["idx"].set(np.array([39], np.int32))  # the plan stays usable
    g.compute()
    assert not np.array_equal(p["K"].numpy()[:, 39], K0[:, 39])


@cuda
@pytest.mark.parametrize("name", ["llama.cpp", "set-rows", "gqa", "diag-mask"])
def test_forms_equal_the_steps_apart_and_the_reference(monkeypatch, name):
    import forms as F
    base = F.Dims(n_embd=512, n_head=8, n_head_kv=8, n_ff=64, n_ctx=64)
    f = F.FORMS[name]
    d = f.dims(base)
    arrays, (k, v) = F.make_arrays(d, ffn=False), F.make_cache_rows(d)
    x = np.random.default_rng(3).standard_normal(d.n_embd).astype(np.float32)
    results = []
    for epilogue in (True, False):
        if not epilogue:
            monkeypatch.setattr(siblings, "EPILOGUE_OPS", ())
        b = F.build(f, base, 37, arrays, k, v, x, backends=("cuda",))
        assert (len(b.graph.plan.steps) == 3) is epilogue
        b.graph.compute()
        results.append((b.result(), b.ctx))
        if epilogue:
            assert nmse(b.result(), b.reference()) <= 5e-4
    assert np.array_equal(results[0][0], results[1][0])
