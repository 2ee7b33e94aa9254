"""The epilogue fusion (gg/graph/fuse.py fuse_epilogues, kernels/mul_mat.cu MvEpi): a decode
step's normalized QKV product also ropes q and k and writes K and V into the cache, one launch
instead of four. Planning needs no GPU; on a GPU the results are checked against float64
references and, bit for bit, against the same plan with the rope and the writes as steps of
their own."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg import llama as L
from gg.backends.cuda.families import matmul
from reference import ref_mul_mat, ref_rms_norm, ref_rope, ref_set_rows
from reference_helpers import nmse

cuda = pytest.mark.cuda
EPI = matmul.NORM_MATVEC + ("rope", "set_rows", "set_rows")
WIDE = dict(n_embd=2048, n_head=16, n_ff=64, n_ctx=24)  # F16 rows of 2048: the wide mat-vec


def rand(rng, *shape):
    return (rng.standard_normal(shape) + 0.1).astype(np.float32)


# ---- the plan (no GPU) --------------------------------------------------------------------------
def _decode_plan(fuse=True, **kw):
    cfg = L.Config(**{**WIDE, **kw})
    ctx = gg.Context()
    weights, cache = L.Weights.random(cfg, ctx), L.KVCache(cfg, ctx)
    graph, _, _ = L.build_forward_pass(cfg, weights, cache, L.Batch.indexed(cfg, ctx, 1),
                                       backends=("cuda", "cpu"), fuse=fuse)
    return graph.plan, cache


@pytest.mark.parametrize("n_head_kv", [16, 4])
def test_decode_step_ropes_and_writes_the_cache_in_the_product(n_head_kv):
    plan, cache = _decode_plan(n_head_kv=n_head_kv)
    first, attention = plan.steps[0], plan.steps[1]
    assert first.ops == EPI and first.kernel == "mul_mat_vecw_norm_epi_f16_f32"
    assert attention.ops[0] == "mul_mat" and "soft_max" in attention.ops  # the flash step is next
    rope, k_write = first.exports
    assert rope.op == "rope" and k_write.op == "set_rows" and first.out.op == "set_rows"
    assert {k_write.root, first.out.root} == {cache.k[0], cache.v[0]}
    product = first.nodes[2]
    # q and k leave the step (attention reads q), the product itself is read inside only
    assert rope in plan.alloc.offsets and product not in plan.alloc.offsets
    assert any(t.root is rope for t in attention.inputs)
    assert "and rope" in str(plan) and "and set_rows" in str(plan)


@pytest.mark.parametrize("n_head_kv", [16, 4])
def test_neox_decode_step_ropes_in_the_product(n_head_kv):
    """NEOX pairs are half a head apart: the block that owns a pair computes both of its rows,
    so HF-converted models (qwen2, phi, SmolLM2) get the same one-launch step."""
    plan, _ = _decode_plan(rope_mode=gg.ROPE_NEOX, n_head_kv=n_head_kv)
    assert plan.steps[0].ops == EPI
    assert plan.steps[0].choice.rope[-1] == 1  # the kernel's neox flag


def test_no_epilogue_without_fusion():
    ops = [s.ops for s in _decode_plan(fuse=False)[0].steps]
    assert not any(len(o) > 3 and o[:3] == matmul.NORM_MATVEC for o in ops)
    assert ("rope",) in ops and ops.count(("set_rows",)) == 2


def _qkv(ctx, rng, n=2048, hd=64, heads=6, v_rows=40, n_dims=64, wdt=gg.F16, kdt=gg.F16, vdt=gg.BF16,
         pos=13, kidx=(5,), output_product=False, mode=gg.ROPE_NORMAL, lo=0, w_first=False):
    """W·(rms_norm(x) * w) = [lo rows | q (heads - 2 heads) | k (2 heads) | v (v_rows)] of one
    token; q and k roped (`mode`) over the first n_dims of each head; k's row into row kidx of K
    (2 of 6 heads: GQA's fewer k heads), v's elements into rows vidx of V (one element each, as
    gg.llama's transposed V cache)."""
    rows = lo + heads * hd + v_rows
    x, w = ctx.tensor(rand(rng, 1, n) * 3.0), ctx.tensor(rand(rng, n))
    W = ctx.tensor(rand(rng, rows, n), dtype=wdt)
    n_x = gg.rms_norm(x, 1e-5)
    qkv = gg.mul_mat(W, gg.mul(w, n_x) if w_first else gg.mul(n_x, w))
    p = ctx.tensor(np.array([pos], np.int32))
    qk = gg.rope(gg.view_3d(qkv, hd, heads, 1, hd * 4, rows * 4, lo * 4), p, n_dims, mode=mode)
    q = gg.view_2d(qk, hd, heads - 2, hd * 4, 0)
    k = gg.reshape(gg.view_3d(qk, hd, 2, 1, hd * 4, heads * hd * 4, (heads - 2) * hd * 4), 2 * hd, 1)
    v = gg.view_2d(qkv, 1, v_rows, 4, (lo + heads * hd) * 4)
    K = ctx.new_tensor(kdt, (2 * hd, 9), persistent=True)
    V = ctx.new_tensor(vdt, (1, 3 * v_rows), persistent=True)
    K.set(rand(rng, 9, 2 * hd))
    V.set(rand(rng, 3 * v_rows, 1))
    vidx = rng.permutation(3 * v_rows)[:v_rows].astype(np.int32)
    ki, vi = ctx.tensor(np.array(kidx, np.int32)), ctx.tensor(vidx)
    kw, vw = gg.set_rows(K, k, ki), gg.set_rows(V, v, vi)
    out = gg.scale(q, 2.0)  # a later reader of q
    outs = (kw, vw, out) + ((qkv,) if output_product else ())
    parts = dict(x=x, w=w, W=W, pos=pos, n_dims=n_dims, hd=hd, heads=heads, K=K, V=V, kidx=ki, vidx=vidx, out=out,
                 qkv=qkv, mode=mode, lo=lo)
    return outs, parts


@pytest.mark.parametrize("mode", [gg.ROPE_NORMAL, gg.ROPE_NEOX])
@pytest.mark.parametrize("output_product", [False, True])
def test_op_level_plan(rng, output_product, mode):
    outs, _ = _qkv(gg.Context(), rng, output_product=output_product, mode=mode, w_first=output_product)
    plan = gg.build_forward(*outs, backends=("cuda", "cpu")).plan
    first = plan.steps[0]
    assert first.ops == EPI
    assert (first.nodes[2] in first.exports) is output_product  # an output keeps its memory


@pytest.mark.parametrize("mode", [gg.ROPE_NORMAL, gg.ROPE_NEOX])
def test_rope_off_the_block_pairs_stays_a_step(rng, mode):
    """q and k starting at an odd product row: a rotated pair would straddle two blocks, so the
    rope (and the writes of roped rows after it) keep their own steps."""
    outs, _ = _qkv(gg.Context(), rng, mode=mode, lo=1)
    ops = [s.ops for s in gg.build_forward(*outs, backends=("cuda", "cpu")).plan.steps]
    assert ops[0] == matmul.NORM_MATVEC and ("rope",) in ops


# ---- on the GPU ---------------------------------------------------------------------------------
def _reference(parts, K0, V0):
    xs = parts["x"].numpy().astype(np.float64)
    h = (ref_rms_norm(xs, 1e-5) * parts["w"].numpy()).astype(np.float32)
    qkv = ref_mul_mat(parts["W"].numpy(), h).reshape(-1)
    hd, heads, lo = parts["hd"], parts["heads"], parts["lo"]
    qk = ref_rope(qkv[lo:lo + hd * heads].reshape(1, heads, hd), np.array([parts["pos"]]), parts["n_dims"],
                  mode=parts["mode"])
    k = qk.reshape(-1)[(heads - 2) * hd:]
    v = qkv[lo + heads * hd:]
    store = {gg.F32: np.float32, gg.F16: np.float16, gg.BF16: "bf16"}
    K = ref_set_rows(K0, k[None], parts["kidx"].numpy(), dtype=store[parts["K"].dtype])
    V = ref_set_rows(V0, v[:, None], parts["vidx"], dtype=store[parts["V"].dtype])
    return 2.0 * qk.reshape(heads, hd)[:heads - 2], K, V


NEOX = gg.ROPE_NEOX


def _no_epilogues(monkeypatch) -> None:
    """Every family that declares epilogue ops declares none (the backend offers their union)."""
    from gg.backends.cuda import families
    for f in families.FAMILIES:
        if hasattr(f, "EPILOGUE_OPS"):
            monkeypatch.setattr(f, "EPILOGUE_OPS", ())


@cuda
@pytest.mark.parametrize("wdt,kdt,vdt,n_dims,n,mode,pos,lo,w_first", [
    (gg.F16, gg.F16, gg.BF16, 64, 2048, 0, 13, 0, False),
    (gg.F32, gg.F32, gg.F16, 32, 1032, 0, 13, 0, False),    # rope of half of each head, F32 rows of 1032
    (gg.BF16, gg.BF16, gg.F32, 48, 4104, 0, 13, 0, False),
    (gg.F16, gg.F16, gg.BF16, 64, 2048, NEOX, 13, 0, False),
    (gg.F32, gg.F32, gg.F16, 32, 1032, NEOX, 777, 2, True),  # NEOX over half a head, q after 2 rows
    (gg.BF16, gg.BF16, gg.F32, 48, 4104, NEOX, 4095, 0, False),
    (gg.F16, gg.F32, gg.F16, 6, 2056, NEOX, 1, 6, True),     # n_dims / 2 odd: pairs (0, 3) (1, 4) (2, 5)
    # short rows: the narrow builds (SmolLM2's 576: 64 threads; 264: 32; F32 576: 128)
    (gg.F16, gg.F16, gg.F16, 64, 576, 0, 100, 0, False),
    (gg.F16, gg.F16, gg.F16, 64, 576, NEOX, 100, 0, False),
    (gg.F32, gg.F32, gg.BF16, 32, 576, NEOX, 5, 2, True),
    (gg.BF16, gg.F16, gg.F16, 64, 264, 0, 3, 0, False),
])
def test_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, kdt, vdt, n_dims, n, mode, pos, lo, w_first):
    _epi_rows(monkeypatch, 2)  # every layout at 2 rows a block (any even lo, head_dim, n_dims)
    _fused_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, kdt, vdt, n_dims, n, mode, pos, lo, w_first)


def _epi_rows(monkeypatch, rows: int) -> None:
    """Every epilogue build (wide and narrow) with `rows` weight rows a block (the kernel's defines too)."""
    for name in ("MMVW_EPI_ROWS", "MMVW_EPI_NARROW_ROWS"):
        monkeypatch.setattr(matmul, name, rows)
        monkeypatch.setitem(matmul.DEFINES["mul_mat.cu"], name, rows)


@pytest.mark.parametrize("n,wide", [(2048, True), (576, False)])
def test_epilogue_rows_follow_the_build_width(rng, n, wide):
    """The wide (MMVW_THREADS) epilogue build takes MMVW_EPI_ROWS rows a block, the narrow ones
    (a small model's 576-wide QKV) MMVW_EPI_NARROW_ROWS, NEOX too where those rows divide it."""
    for mode in (gg.ROPE_NORMAL, NEOX):
        outs, _ = _qkv(gg.Context(), rng, n=n, mode=mode)
        first = gg.build_forward(*outs, backends=("cuda", "cpu")).plan.steps[0]
        assert first.ops == EPI
        assert (first.choice.threads == matmul.MMVW_THREADS) is wide
        assert first.choice.rows == (matmul.MMVW_EPI_ROWS if wide else matmul.MMVW_EPI_NARROW_ROWS)


@cuda
@pytest.mark.parametrize("rows", [4, 8])
@pytest.mark.parametrize("wdt,kdt,vdt,n_dims,n,mode,pos,lo,w_first", [
    (gg.F16, gg.F16, gg.BF16, 64, 2048, 0, 13, 2, False),     # NORMAL pairs at a block's rows 2, 3
    (gg.F16, gg.F16, gg.BF16, 64, 2048, NEOX, 13, 0, False),  # pair slots and their partners
    (gg.F32, gg.F32, gg.F16, 32, 1032, NEOX, 777, 8, True),   # NEOX over half a head
    (gg.BF16, gg.F16, gg.F16, 64, 576, NEOX, 100, 0, False),  # a narrow build
])
def test_more_rows_a_block_match_the_reference_and_the_steps_apart(rng, monkeypatch, rows, wdt, kdt, vdt, n_dims,
                                                                  n, mode, pos, lo, w_first):
    """4 or 8 rows a block (8: the wide build's default): a block holds several rope pairs (NEOX:
    pair slots c/2 .. c/2 + rows/2 - 1 of a head and their partners n_dims/2 further, as the
    sibling epilogue lays its blocks out)."""
    _epi_rows(monkeypatch, rows)
    _fused_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, kdt, vdt, n_dims, n, mode, pos, lo, w_first,
                                                 rows=rows)


@pytest.mark.parametrize("n_dims,lo,fused", [(64, 0, True), (6, 0, False), (64, 2, False)])
def test_four_rows_a_block_take_neox_only_where_the_pairs_fill_blocks(rng, monkeypatch, n_dims, lo, fused):
    """With 4 rows a block a NEOX rope joins only when 4 divides lo, head_dim and n_dims."""
    _epi_rows(monkeypatch, 4)
    outs, _ = _qkv(gg.Context(), rng, n_dims=n_dims, mode=NEOX, lo=lo)
    first = gg.build_forward(*outs, backends=("cuda", "cpu")).plan.steps[0]
    assert (first.ops == EPI) is fused
    if fused:
        assert first.choice.rows == 4


def _fused_matches_reference_and_the_steps_apart(rng, monkeypatch, wdt, kdt, vdt, n_dims, n, mode, pos, lo, w_first,
                                                 rows=2):
    ctx = gg.Context()
    outs, parts = _qkv(ctx, rng, n=n, n_dims=n_dims, wdt=wdt, kdt=kdt, vdt=vdt, mode=mode, pos=pos, lo=lo,
                       w_first=w_first)
    K0, V0 = parts["K"].numpy().copy(), parts["V"].numpy().copy()
    g = gg.build_forward(*outs, backends=("cuda",))
    assert g.plan.steps[0].ops == EPI and g.plan.steps[0].choice.rows == rows
    g.compute()
    got = [parts["out"].numpy().copy(), parts["K"].numpy().copy(), parts["V"].numpy().copy()]
    ref = _reference(parts, K0, V0)
    assert nmse(got[0], ref[0]) <= 1e-7
    for a, b, t in zip(got[1:], ref[1:], (kdt, vdt)):
        assert nmse(a.astype(np.float64), b) <= (1e-7 if t is gg.F32 else 1e-5)
    # rows not written keep their bits (the cache loses nothing)
    untouched = np.ones(K0.shape[0], bool)
    untouched[parts["kidx"].numpy()] = False
    assert np.array_equal(got[1][untouched], K0[untouched])
    vkeep = np.ones(V0.shape[0], bool)
    vkeep[parts["vidx"]] = False
    assert np.array_equal(got[2][vkeep], V0[vkeep])

    # the same plan with the rope and both writes as their own steps: the same bits
    parts["K"].set(K0), parts["V"].set(V0)
    _no_epilogues(monkeypatch)
    g2 = gg.build_forward(*outs, backends=("cuda",))
    assert [s.ops for s in g2.plan.steps][:2] == [matmul.NORM_MATVEC, ("rope",)]
    g2.compute()
    apart = [parts["out"].numpy(), parts["K"].numpy(), parts["V"].numpy()]
    for a, b in zip(got, apart):
        assert np.array_equal(a, b)


@cuda
def test_an_index_out_of_range_is_an_error_and_writes_nothing(rng):
    ctx = gg.Context()
    outs, parts = _qkv(ctx, rng, kidx=(9,))  # K has 9 rows
    K0 = parts["K"].numpy().copy()
    g = gg.build_forward(*outs, backends=("cuda",))
    assert g.plan.steps[0].ops == EPI
    with pytest.raises(gg.BackendError, match="out of range"):
        g.compute()
    assert np.array_equal(parts["K"].numpy(), K0)
    parts["kidx"].set(np.array([8], np.int32))  # the plan stays usable
    g.compute()
    assert not np.array_equal(parts["K"].numpy()[8], K0[8])


@cuda
@pytest.mark.parametrize("n_head_kv,rope_mode", [(16, gg.ROPE_NORMAL), (4, gg.ROPE_NORMAL), (4, gg.ROPE_NEOX)])
def test_llama_decode_equals_the_steps_apart(rng, monkeypatch, n_head_kv, rope_mode):
    """A prefill then decode steps of a llama layer wide enough for the epilogue: outputs and
    both caches bit-identical with the epilogue off, and close to the float64 model."""
    from llama_ref import RefLlama
    cfg = L.Config(**WIDE, n_head_kv=n_head_kv, rope_mode=rope_mode)
    weights = L.Weights.random(cfg, gg.Context(), seed=7)
    xs = rng.standard_normal((8, cfg.n_embd)).astype(np.float32)
    runs = []
    for epilogue in (True, False):
        if not epilogue:
            _no_epilogues(monkeypatch)
        sess = L.Session(cfg, weights, backends=("cuda",))
        outs = [sess.prefill(xs[:4])] + [sess.decode(xs[i]) for i in range(4, 8)]
        assert (sess.decoder.graph.plan.steps[0].ops == EPI) is epilogue
        runs.append((outs, sess.cache.keys(0), sess.cache.values(0)))
    (a, ka, va), (b, kb, vb) = runs
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert np.array_equal(ka, kb) and np.array_equal(va, vb)
    ref = RefLlama(cfg.n_head, cfg.n_head_kv, cfg.rope_mode, cfg.rope_base, cfg.rope_scale, cfg.eps,
                   weights.numpy())
    want = [ref.forward(xs[:4])] + [ref.forward(xs[i:i + 1]) for i in range(4, 8)]
    assert all(nmse(p, q.reshape(p.shape)) <= 5e-4 for p, q in zip(a, want))
    assert nmse(ka, np.stack(ref.keys[0])) <= 1e-6 and nmse(va, np.stack(ref.values[0])) <= 1e-6


def test_profile_bytes_count_the_rows_written_not_the_cache():
    """A KV-cache write moves its rows, not the cache: the fused step's bytes are the weights,
    the inputs and what it writes."""
    from gg.graph.profile import step_bytes
    plan, _ = _decode_plan()
    n, f32, f16 = WIDE["n_embd"], 4, 2
    reads = 3 * n * n * f16 + 2 * n * f32 + 4 + n * 4  # wqkv, x, norm w, pos (the K row too), V rows
    writes = 2 * n * f32 + n * f16 + n * f16                # q and k roped, the K row, V's elements
    assert step_bytes(plan.steps[0]) == reads + writes
