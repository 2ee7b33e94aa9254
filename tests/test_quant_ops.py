"""Ops on ggml block-quantized tensors: the tensor model (ne/nb of blocks, views of whole rows,
numpy() dequantizes, tobytes, tensor_from_bytes, gg.quantize), then mul_mat(q, F32) and
get_rows(q, idx) on the CPU and on CUDA, against float64 numpy over the dequantized weights
(NMSE <= 1e-6: the activations stay F32). Blocks of every type come from random bytes with sane
F16 scales (gg cannot quantize to Q4_K/Q6_K; their decoding is checked against gguf in
test_quant.py)."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg import quant
from gg.backends.cuda.families import blocks
from plan_stubs import check_early_read_rule, in_plan, stub_step
from reference import nmse
from reference_helpers import NMSE_QUANT_ACTIVATIONS, nmse_fused_vs_plain, nmse_vs_reference

TYPES = [gg.Q8_0, gg.Q4_0, gg.Q4_1, gg.Q4_K, gg.Q6_K]
SCALES = {gg.Q8_0: (0,), gg.Q4_0: (0,), gg.Q4_1: (0, 2), gg.Q4_K: (0, 2), gg.Q6_K: (208,)}  # F16 fields


def random_weights(rng, dt, rows: int, k: int, ctx=None) -> gg.Tensor:
    """A (k, rows) weight leaf of dt from random blocks with finite, moderate F16 scales."""
    n = rows * k // dt.block_size
    raw = rng.integers(0, 256, (n, dt.size), dtype=np.uint8)
    for off in SCALES[dt]:
        vals = (rng.uniform(0.5, 1.5, n) * rng.choice([-1, 1], n) * 2.0 ** -6).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n, 2)
    return (ctx or gg.Context()).tensor_from_bytes(raw.tobytes(), dt, (k, rows), name=f"w_{dt.name}")


# ---- the tensor model -------------------------------------------------------------------------
@pytest.mark.parametrize("dt", TYPES)
def test_block_tensor_layout_and_round_trip(dt, rng):
    w = random_weights(rng, dt, 5, 512)
    assert w.nb[:2] == (dt.size, 512 // dt.block_size * dt.size) and w.storage_bytes == 5 * w.nb[1]
    values = w.numpy()
    assert values.shape == (5, 512) and values.dtype == np.float32 and np.isfinite(values).all()
    raw = w.tobytes()
    assert np.array_equal(values, quant.dequantize(np.frombuffer(raw, np.uint8).reshape(5, -1), dt))
    row = gg.view_2d(w, 512, 2, w.nb[1], 3 * w.nb[1])  # whole rows: fine
    assert np.array_equal(row.numpy(), values[3:5])


def test_views_that_cut_blocks_are_refused(rng):
    w = random_weights(rng, gg.Q4_0, 4, 64)
    with pytest.raises(gg.ShapeError):
        gg.view_1d(w, 16)  # half a block
    with pytest.raises(gg.ShapeError):
        gg.transpose(w)  # blocks out of row order
    with pytest.raises(gg.ShapeError):
        gg.new_tensor(gg.Q8_0, (48, 2))  # a row of 1.5 blocks


@pytest.mark.parametrize("dt", [gg.Q8_0, gg.Q4_0, gg.Q4_1])
def test_quantize_and_set(dt, rng):
    a = rng.standard_normal((3, 64)).astype(np.float32)
    t = gg.quantize(a, dt)
    assert t.tobytes() == quant.quantize(a, dt).tobytes()
    s = gg.new_tensor(dt, (64, 3))
    s.set(a)
    assert s.tobytes() == t.tobytes()
    assert nmse(t.numpy(), a) < 1e-2  # 4-8 bit blocks
    with pytest.raises(gg.ShapeError):
        gg.Context().tensor_from_bytes(b"\0" * 10, dt, (64, 3))


# ---- ops ----------------------------------------------------------------------------------------
def _mul_mat_case(rng, dt, rows, k, cols, batch=1):
    ctx = gg.Context()
    w = random_weights(rng, dt, rows, k, ctx)
    xa = rng.standard_normal((batch, cols, k)).astype(np.float32)
    return w, xa, gg.mul_mat(w, ctx.tensor(xa))


def _check_mul_mat(w, xa, y, backends):
    g = gg.build_forward(y, backends=backends)
    g.compute()
    want = np.einsum("bnk,mk->bnm", xa.astype(np.float64), w.numpy().astype(np.float64))
    assert nmse(y.numpy().reshape(want.shape), want) <= nmse_vs_reference(g)


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("cols,batch", [(1, 1), (3, 1), (5, 2), (17, 1)])
def test_mul_mat_quantized_cpu(dt, cols, batch, rng):
    _check_mul_mat(*_mul_mat_case(rng, dt, 33, 512, cols, batch), ("cpu",))


@pytest.mark.parametrize("dt", TYPES)
def test_get_rows_quantized_cpu(dt, rng):
    w = random_weights(rng, dt, 9, 256)
    idx = gg.tensor(np.array([8, 0, 3, 3], np.int32))
    r = gg.get_rows(w, idx)
    gg.build_forward(r, backends=("cpu",)).compute()
    assert np.array_equal(r.numpy(), w.numpy()[[8, 0, 3, 3]])


# (rows, K, columns, batch): one and several columns, rows not 16-byte aligned (K = 576: 3 row groups
# per block), many chunks per row (K = 14336), a partial last chunk (K = 2560), the GEMM path
CUDA_CASES = [(33, 512, 1, 1), (96, 4096, 1, 1), (33, 512, 3, 1), (65, 1024, 8, 1), (40, 512, 3, 2),
              (70, 512, 40, 1), (257, 2048, 512, 1), (257, 576, 1, 1), (61, 14336, 1, 1), (37, 2560, 1, 1),
              (19, 4096, 2, 1), (45, 576, 8, 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("dt,rows,k,cols,batch", [(dt, *c) for dt in TYPES for c in CUDA_CASES
                                                  if c[1] % dt.block_size == 0])
@pytest.mark.parametrize("qx,stream", [(True, True), (True, False), (False, False)])
def test_mul_mat_quantized_cuda(dt, rows, k, cols, batch, rng, qx, stream, monkeypatch):
    """Every one-column build: the streaming one and mul_mat_vec1 with int8 activations (dp4a,
    NMSE <= 5e-4), mul_mat_vec1 with F32 ones (<= 1e-6)."""
    monkeypatch.setattr(blocks, "QUANT_ACTIVATIONS", qx)
    monkeypatch.setattr(blocks, "STREAM_MATVEC", stream)
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)  # small matrices too
    w, xa, y = _mul_mat_case(rng, dt, rows, k, cols, batch)
    g = gg.build_forward(y, backends=("cuda",))
    kernel = g.plan.steps[-1].kernel
    assert g.plan.steps[-1].backend == "cuda" and dt.name in kernel
    one = cols * batch == 1
    assert kernel.startswith("mul_mat_vecs") == (one and stream and dt in blocks.STREAM_TYPES)
    assert kernel.endswith("_qx") == (qx and one and dt in blocks.QX_TYPES + blocks.STREAM_TYPES * stream)
    _check_mul_mat(w, xa, y, ("cuda",))


@pytest.mark.parametrize("rows,k,R,slots", [(4500, 4096, 16, 1), (3000, 4096, 8, 1), (200, 4096, 4, 1),
                                           (9000, 160, 4, 8), (49152, 576, 16, 7)])
def test_streaming_matvec_rows_per_block(rows, k, R, slots, monkeypatch):
    """The largest R that still gives blocks.MVS_MIN_BLOCKS blocks (else the smallest); short rows
    (K / 32 < MVS_THREADS) put row groups side by side."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    w = gg.new_tensor(gg.Q4_0, (k, rows))
    assert blocks.matvec1_symbol(w) == f"mul_mat_vecs{R}_q4_0_f32_qx"
    v = blocks.matvec1(w)[1]
    assert v is not None and v.parts == 1 and (v.R, v.slots) == (R, slots)
    grid, block, smem = v.launch(gg.Q4_0)
    assert grid[0] == -(-rows // (R * slots)) and block == (blocks.MVS_THREADS, 1, 1) and smem >= 4 * R * block[0]


@pytest.mark.parametrize("rows,k,parts,per,R", [(4096, 14336, 4, 112, 16), (4096, 4128, 2, 65, 16),
                                               (200, 14336, 4, 112, 4), (14336, 4096, 1, 128, 16),
                                               (33, 32 * 128 * 9, 8, 144, 4)])
def test_streaming_matvec_cuts_long_rows(rows, k, parts, per, R, monkeypatch):
    """Rows longer than one chunk (blocks.MVS_THREADS quant blocks) are cut into that many parts
    (at most MVS_MAX_PARTS, a part then takes several chunks), a block each; the parts' sums need
    scratch (parts x rows floats) and a ticket per row block in the step's table bytes."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    w = gg.new_tensor(gg.Q4_0, (k, rows))
    v = blocks.matvec1(w)[1]
    assert v is not None and (v.parts, v.per, v.R) == (parts, per, R)
    grid, _, smem = v.launch(gg.Q4_0)
    assert grid[0] == v.row_blocks * parts and v.row_blocks == -(-rows // (R * v.slots))
    assert (v.scratch, v.table) == ((4 * parts * rows, 4 * v.row_blocks) if parts > 1 else (0, 0))
    stages = 1 if per <= blocks.MVS_THREADS else 2
    assert smem == stages * v.slots * R * ((v.tpr * gg.Q4_0.size + 31) // 16 * 16)
    g = gg.build_forward(gg.mul_mat(w, gg.new_tensor(gg.F32, (k,))), backends=("cuda",))
    assert g.plan.steps[-1].choice.vecs == v and g.plan.steps[-1].choice.scratch == v.scratch


@pytest.mark.parametrize("rows,k,parts,per,tpr,slots,pitch", [(49152, 4096, 1, 16, 128, 1, 3376),
                                                              (4096, 14336, 4, 14, 112, 1, 2960),
                                                              (19, 4352, 2, 9, 72, 1, 1920),
                                                              (900, 512, 1, 2, 16, 8, 448)])
def test_streaming_q6_k_geometry(rows, k, parts, per, tpr, slots, pitch, monkeypatch):
    """Q6_K streams in items of 32 elements, 8 a 210-byte block: a chunk of MVS_THREADS items is 16
    blocks of a row (3360 bytes, staged at a 16-byte pitch with room to realign), parts count
    items, and a short row (K = 512: 16 items) puts 8 row groups side by side."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    assert blocks.items_per_block(gg.Q6_K) == 8 and blocks.items_per_block(gg.Q8_0) == 1
    w = gg.new_tensor(gg.Q6_K, (k, rows))
    name, v = blocks.matvec1(w)
    assert name == f"mul_mat_vecs{v.R}_q6_k_f32_qx"
    assert (v.parts, v.per, v.tpr, v.slots) == (parts, per, tpr, slots)
    _, _, smem = v.launch(gg.Q6_K)
    assert smem == max(v.slots * v.R * pitch, 4 * v.R * blocks.MVS_THREADS if slots > 1 else 0)


STREAM_CASES = [(40, 32, 0, 0, False), (17, 4128, 3, 1, True), (50, 14336, 1, 0, True), (33, 576, 2, 3, False),
                (300, 4096, 0, 0, True), (4500, 4096, 1, 0, True), (3000, 4096, 0, 1, False),
                (9000, 160, 0, 0, False), (33, 768, 1, 3, True), (19, 4352, 0, 1, True)]


@pytest.mark.cuda
@pytest.mark.parametrize("dt,rows,k,lo,xoff,res", [(dt, *c) for dt in blocks.STREAM_TYPES for c in STREAM_CASES
                                                   if c[1] % dt.block_size == 0])
def test_streaming_matvec_views_and_residual(dt, rows, k, lo, xoff, res, rng, monkeypatch):
    """mul_mat_vecs<R>_*: one block and a partial last chunk (K = 32, 4128; Q6_K's 8 items a block:
    4352 in 2 parts of 72 and 64 items), rows that start off a 16-byte boundary (a view from row
    `lo`; K = 576, 768), an x not 16-byte aligned (`xoff` floats into a row), the residual added
    as it writes, every R of blocks.MVS_ROWS (4500 rows take 16, 3000 rows 8, 9000 rows of 5 blocks
    4 in 8 groups a block), rows cut into parts (K = 4128: 2, 14336: 4), computed twice; NMSE
    against float64 within ggml's bound."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    w_all = random_weights(rng, dt, rows + lo, k, ctx)
    w = gg.view_2d(w_all, k, rows, w_all.nb[1], lo * w_all.nb[1])
    xa = rng.standard_normal(k + xoff).astype(np.float32)
    xt = ctx.tensor(xa)
    x = gg.view_1d(xt, k, xoff * 4)
    y = gg.mul_mat(w, x)
    ra = rng.standard_normal(rows).astype(np.float32)
    out = gg.add(y, ctx.tensor(ra)) if res else y
    g = gg.build_forward(out, backends=("cuda",))
    assert [s.kernel for s in g.plan.steps] == [blocks.matvec1_symbol(w)]
    assert blocks.matvec1_symbol(w).startswith("mul_mat_vecs")
    for _ in range(2):  # again with a new x: long rows' parts meet through tickets the last block resets
        g.compute()
        want = w_all.numpy()[lo:].astype(np.float64) @ xa[xoff:].astype(np.float64) + (ra if res else 0.0)
        assert nmse(out.numpy().reshape(-1), want) <= NMSE_QUANT_ACTIVATIONS
        xa = rng.standard_normal(k + xoff).astype(np.float32)
        xt.set(xa)


# Short rows back to back, one chunk each (K = 576: a SmolLM2 head's 612-byte Q8_0, 360-byte Q4_1 and
# 324-byte Q4_0 rows, off 16-byte boundaries) are one span of memory a block, copied whole
# (kernels/quant.cu mvs_impl `dense`): sm_90's bulk copies where the span starts and ends on 16-byte
# boundaries (28 or 112 rows a block from row 0), 16-byte pieces where it does not (`lo`: a view
# from row 1 or 3; 1121 and 2243 rows: a last block of 1 or 3 rows). min_blocks 8: the head's 16
# rows in 7 slots a block; else 4 rows.
@pytest.mark.cuda
@pytest.mark.parametrize("dt", [gg.Q8_0, gg.Q4_0, gg.Q4_1])
@pytest.mark.parametrize("rows,lo,norm,min_blocks", [(4480, 0, True, 8), (4480, 0, False, 264), (4480, 1, False, 8),
                                                     (1121, 0, False, 264), (2243, 3, True, 8)])
def test_streaming_dense_spans(dt, rows, lo, norm, min_blocks, rng, monkeypatch):
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(blocks, "MVS_MIN_BLOCKS", min_blocks)
    k = 576
    ctx = gg.Context()
    w_all = random_weights(rng, dt, rows + lo, k, ctx)
    w = gg.view_2d(w_all, k, rows, w_all.nb[1], lo * w_all.nb[1])
    xa = (rng.standard_normal(k) * 3).astype(np.float32)
    nw = rng.standard_normal(k).astype(np.float32)
    xt = ctx.tensor(xa)
    y = gg.mul_mat(w, gg.mul(gg.rms_norm(xt, 1e-5), ctx.tensor(nw)) if norm else xt)
    g = gg.build_forward(y, backends=("cuda",))
    v = blocks.vecs(dt, rows, k, norm=norm)
    assert v.slots == 7 and v.parts == 1 and v.R == (16 if min_blocks == 8 else 4)
    assert [s.kernel for s in g.plan.steps] == [blocks.vecs_name(dt, v.R, norm)]
    wd = w_all.numpy()[lo:].astype(np.float64)
    for _ in range(2):
        g.compute()
        x64 = xa.astype(np.float64)
        h = x64 / np.sqrt((x64 * x64).mean() + 1e-5) * nw if norm else x64
        assert nmse(y.numpy().reshape(-1), wd @ h) <= NMSE_QUANT_ACTIVATIONS
        xa = (rng.standard_normal(k) * 3).astype(np.float32)
        xt.set(xa)


@pytest.mark.cuda
@pytest.mark.parametrize("dt,k,parts", [(dt, k, parts) for dt in blocks.STREAM_TYPES
                                        for k, parts in [(14336, 1), (36864, 0), (4096, 0), (4128, 0)]
                                        if k % dt.block_size == 0])
def test_streaming_matvec_chunks_in_turn(dt, k, parts, rng, monkeypatch):
    """A part of several chunks (K = 14336 in one part: 4 chunks of Q4_0, 2 stages taken in turn, so
    each stage's barrier or copy group is reused; 36864 in 8 parts of 2 chunks), a part of one
    chunk, and K = 4128 (chunks not multiples of 16 bytes): rows aligned to 16 bytes take sm_90's
    bulk copies, the rest the 16-byte copies; computed twice with new x against float64."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(blocks, "MVS_PARTS", parts)
    ctx = gg.Context()
    w = random_weights(rng, dt, 37, k, ctx)
    xt = ctx.tensor(rng.standard_normal(k).astype(np.float32))
    y = gg.mul_mat(w, xt)
    g = gg.build_forward(y, backends=("cuda",))
    v = g.plan.steps[-1].choice.vecs
    assert v is not None and (parts == 0 or v.parts == parts)
    for _ in range(2):
        xa = rng.standard_normal(k).astype(np.float32)
        xt.set(xa)
        g.compute()
        assert nmse(y.numpy().reshape(-1), w.numpy().astype(np.float64) @ xa.astype(np.float64)) <= NMSE_QUANT_ACTIVATIONS


@pytest.mark.cuda
@pytest.mark.parametrize("dt", [gg.Q4_0, gg.Q8_0, gg.Q6_K])
def test_streaming_weights_evict_first_changes_no_value(dt, rng, monkeypatch):
    """blocks.MVS_EVICT_FIRST: the bulk copies' L2 policy only decides which lines L2 drops first;
    a product in K parts and the head-like short rows (one span a block) give the same bits with
    and without it, right against float64."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    shapes = [(300, 14336), (517, 576 if dt.block_size == 32 else 512)]
    ws = [random_weights(rng, dt, m, k, ctx) for m, k in shapes]
    xs = [ctx.tensor(rng.standard_normal(k).astype(np.float32)) for _, k in shapes]
    got = {}
    for evict in (0, 1):
        monkeypatch.setattr(blocks, "MVS_EVICT_FIRST", evict)
        monkeypatch.setitem(blocks.DEFINES["quant.cu"], "QUANT_MVS_EVICT_FIRST", evict)
        ys = [gg.mul_mat(w, x) for w, x in zip(ws, xs)]
        g = gg.build_forward(*ys, backends=("cuda",))
        assert all(s.choice.vecs is not None for s in g.plan.steps)
        g.compute()
        for w, x, y in zip(ws, xs, ys):
            want = w.numpy().astype(np.float64) @ x.numpy().astype(np.float64)
            assert nmse(y.numpy().reshape(-1), want) <= NMSE_QUANT_ACTIVATIONS
        got[evict] = [y.numpy().copy() for y in ys]
    for a, b in zip(got[0], got[1]):
        assert np.array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dt", [gg.Q4_0, gg.Q8_0])
def test_streaming_parts_meet_with_either_ticket(dt, rng, monkeypatch):
    """The K parts' ticket with a fence by every thread (blocks.MVS_RELEASE 0) or one acq_rel atomic
    after the barrier (1): the same bits, right against float64, three computes in a row with new
    x (each last block resets its ticket)."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    w = random_weights(rng, dt, 300, 14336, ctx)
    xt = ctx.tensor(rng.standard_normal(14336).astype(np.float32))
    r = rng.standard_normal(300).astype(np.float32)
    xs = [rng.standard_normal(14336).astype(np.float32) for _ in range(3)]
    got = {}
    for release in (0, 1):
        monkeypatch.setattr(blocks, "MVS_RELEASE", release)
        monkeypatch.setitem(blocks.DEFINES["quant.cu"], "QUANT_MVS_RELEASE", release)
        y = gg.add(gg.mul_mat(w, xt), ctx.tensor(r))
        g = gg.build_forward(y, backends=("cuda",))
        assert g.plan.steps[-1].choice.vecs.parts == 4
        got[release] = []
        for xa in xs:
            xt.set(xa)
            g.compute()
            want = w.numpy().astype(np.float64) @ xa.astype(np.float64) + r
            assert nmse(y.numpy().reshape(-1), want) <= NMSE_QUANT_ACTIVATIONS
            got[release].append(y.numpy().copy())
    for a, b in zip(got[0], got[1]):
        assert np.array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dt", blocks.STREAM_TYPES)
def test_streaming_chain_early_weights_change_nothing(dt, rng, monkeypatch):
    """An FFN of streaming steps (gate/up + SwiGLU, down in 3 parts + residual, then a product of
    that): the blocks copy their first weights before waiting for the kernel before them
    (launch.EARLY_WEIGHTS) or after; the results are the same bits, over two computes with new x."""
    from gg.backends.cuda import launch
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    ctx = gg.Context()
    K, F = 1024, 32 * 264  # down: 264 blocks a row, 3 parts
    wg, wu = random_weights(rng, dt, F, K, ctx), random_weights(rng, dt, F, K, ctx)
    wd, wo = random_weights(rng, dt, K, F, ctx), random_weights(rng, dt, 300, K, ctx)
    xt = ctx.tensor(rng.standard_normal(K).astype(np.float32))
    h = gg.add(gg.mul_mat(wd, gg.mul(gg.silu(gg.mul_mat(wg, xt)), gg.mul_mat(wu, xt))), xt)
    y = gg.mul_mat(wo, h)
    xs = [rng.standard_normal(K).astype(np.float32) for _ in range(2)]
    got = []
    for early in (True, False):
        monkeypatch.setattr(launch, "EARLY_WEIGHTS", early)
        g = gg.build_forward(y, backends=("cuda",))
        assert [s.kernel.split("_")[2][:4] for s in g.plan.steps] == ["sibs", "vecs", "vecs"]
        assert g.plan.steps[1].choice.vecs.parts == 3
        for xa in xs:
            xt.set(xa)
            g.compute()
            got.append(y.numpy().copy())
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[1], got[3])
    x64 = xs[1].astype(np.float64)
    g64, u64 = wg.numpy().astype(np.float64) @ x64, wu.numpy().astype(np.float64) @ x64
    h64 = wd.numpy().astype(np.float64) @ (g64 / (1 + np.exp(-g64)) * u64) + x64
    assert nmse(got[1].reshape(-1), wo.numpy().astype(np.float64) @ h64) <= 4 * NMSE_QUANT_ACTIVATIONS


def test_unwritten_weights(monkeypatch):
    """launch.unwritten: a tensor whose bytes no step of the plan being lowered writes (outputs or
    scratch); outside a lowering with its steps, nothing counts as unwritten."""
    from types import SimpleNamespace
    from gg.backends.cuda import launch
    ctx = gg.Context()
    out, w, v = ctx.new_tensor(gg.F32, (64,)), ctx.new_tensor(gg.Q4_0, (64, 4)), ctx.new_tensor(gg.F32, (8,))
    where = {out: 0, w: 256, v: 512}

    class Memory:
        def locate(self, t):
            return SimpleNamespace(ptr=1 << 32), where[t.root]

        def workspace(self, step, kind):
            return SimpleNamespace(ptr=1 << 32), 1024

    step = SimpleNamespace(outs=[out], choice=SimpleNamespace(scratch=64))
    with launch.bound(Memory(), [step]):
        assert launch.unwritten(w) and launch.unwritten(v)
        where[v] = 1000  # overlaps the scratch [1024, 1088)
        assert not launch.unwritten(v)
        where[w] = 200  # 64 x 4 Q4_0 = 4 blocks of 18 bytes: [200, 272) meets out's [0, 256)
        assert not launch.unwritten(w)
    with launch.bound(Memory()):
        where[w] = 4096
        assert not launch.unwritten(w)


def test_streaming_pdl_flags(monkeypatch):
    """The streaming kernels' pdl flags (blocks.vecs_args): MVS_EARLY for weights no step writes,
    unless the step before is a normalization; MVS_LATE when the next step streams too (with
    blocks.LATE_BEFORE_STREAMING); neither with launch.EARLY_WEIGHTS off."""
    from types import SimpleNamespace
    from gg.backends.cuda import launch
    from gg.backends.cuda.launch import Args
    ctx = gg.Context()
    w, out = ctx.new_tensor(gg.Q4_0, (4096, 64)), ctx.new_tensor(gg.F32, (64,))
    where = {w: 1 << 20, out: 0}
    v = blocks.vecs(gg.Q4_0, 64, 4096)
    kinds = {"vecs": (("mul_mat",), SimpleNamespace(vecs=v)), "rope": (("rope",), None),
             "norm": (("rms_norm", "mul"), None)}

    def flags(*names):  # of the second step of a plan of these steps
        steps = [stub_step(kinds[n][0], out, kinds[n][1]) for n in names]
        # (the pdl flags, then the carried norm's four arguments)
        return in_plan(lambda s: int(blocks.vecs_args(Args(), s, v, w)._vals[-5][0]), where, steps, 1)
    E, L = blocks.MVS_EARLY, blocks.MVS_LATE
    assert flags("rope", "vecs", "rope") == E
    assert flags("vecs", "vecs", "vecs") == E  # (blocks.LATE_BEFORE_STREAMING off)
    monkeypatch.setattr(blocks, "LATE_BEFORE_STREAMING", 1)
    assert flags("vecs", "vecs", "vecs") == E | L
    assert flags("norm", "vecs", "vecs") == L
    where[w] = 0  # the weights now share bytes with the steps' output
    assert flags("rope", "vecs") == 0
    monkeypatch.setattr(launch, "EARLY_WEIGHTS", False)
    where[w] = 1 << 20
    assert flags("rope", "vecs", "vecs") == 0


def test_matvec_pdl_flags(monkeypatch):
    """The mat-vecs' pdl flag (blocks.early_flag(matvec=True), mul_mat_vec* / mul_mat_sibq*):
    MVS_EARLY by the streaming rules (launch.may_read_early: never in a plan's first step), off
    with blocks.EARLY_MATVEC or launch.EARLY_WEIGHTS off."""
    w = gg.Context().new_tensor(gg.Q4_1, (576, 64))
    check_early_read_rule(lambda step, weight: blocks.early_flag(step, weight, matvec=True), w, blocks.MVS_EARLY,
                          (blocks, "EARLY_MATVEC"), monkeypatch)


@pytest.mark.cuda
@pytest.mark.parametrize("dt", blocks.TYPES)
def test_matvec_chain_early_weights_change_nothing(dt, rng, monkeypatch):
    """A small model's chain of mat-vec steps (none streams): a normalized stacked-QKV sibling
    step, a SwiGLU sibling step, a product with a residual (mul_mat_vec1), a 3-column product
    (mul_mat_vec): their blocks copy their first weights before waiting for the kernel before
    them (blocks.EARLY_MATVEC) or after; the same bits, over two computes with new x."""
    ctx = gg.Context()
    K, F = 512, 1536
    wq, wk, wv, wo = (random_weights(rng, dt, m, K, ctx) for m in (K, 128, 128, K))
    wg, wu, wd = random_weights(rng, dt, F, K, ctx), random_weights(rng, dt, F, K, ctx), random_weights(rng, dt, K, F, ctx)
    w3 = random_weights(rng, dt, 96, K, ctx)
    xt = ctx.tensor(rng.standard_normal(K).astype(np.float32))
    hn = gg.mul(gg.rms_norm(xt, 1e-5), ctx.tensor(rng.standard_normal(K).astype(np.float32)))
    qkv = [gg.mul_mat(w, hn) for w in (wq, wk, wv)]
    h = gg.add(gg.mul_mat(wo, qkv[0]), xt)
    f = gg.add(gg.mul_mat(wd, gg.mul(gg.silu(gg.mul_mat(wg, h)), gg.mul_mat(wu, h))), h)
    y3 = gg.mul_mat(w3, ctx.tensor(rng.standard_normal((3, K)).astype(np.float32)))
    outs = (*qkv, f, y3)
    xs = [rng.standard_normal(K).astype(np.float32) for _ in range(2)]
    got = []
    for early in (True, False):
        monkeypatch.setattr(blocks, "EARLY_MATVEC", early)
        g = gg.build_forward(*outs, backends=("cuda",))
        assert not any(s.kernel.startswith(("mul_mat_vecs", "mul_mat_sibs")) for s in g.plan.steps), str(g.plan)
        assert sum(s.kernel.startswith("mul_mat_sibq") for s in g.plan.steps) == 2, str(g.plan)
        for xa in xs:
            xt.set(xa)
            g.compute()
            got.append([o.numpy().copy() for o in outs])
    for a, b in ((got[0], got[2]), (got[1], got[3])):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


@pytest.mark.cuda
@pytest.mark.parametrize("dt", blocks.QX_TYPES)
def test_quantized_activations_error_is_ggmls(dt, rng):
    """The int8-activation product's error is the activations' rounding: above the F32 build's,
    within ggml's bound, and the same for a scaled input (per-block scales)."""
    w, xa, y = _mul_mat_case(rng, dt, 512, 4096, 1)
    g = gg.build_forward(y, backends=("cuda",))
    assert g.plan.steps[-1].kernel.endswith("_qx")
    g.compute()
    want = (xa.astype(np.float64) @ w.numpy().astype(np.float64).T).reshape(-1)
    err = nmse(y.numpy().reshape(-1), want)
    assert 1e-9 < err <= NMSE_QUANT_ACTIVATIONS


@pytest.mark.cuda
@pytest.mark.parametrize("dt", TYPES)
def test_get_rows_quantized_cuda_equals_cpu(dt, rng):
    w = random_weights(rng, dt, 300, 512)
    idx = gg.tensor(np.array([299, 0, 7, 7, 150], np.int32))
    r = gg.get_rows(w, idx)
    g = gg.build_forward(r, backends=("cuda",))
    assert g.plan.steps[0].kernel == f"get_rows_{dt.name}_f32"
    g.compute()
    assert np.array_equal(r.numpy(), w.numpy()[[299, 0, 7, 7, 150]])  # dequantization is bit-identical


@pytest.mark.cuda
def test_get_rows_quantized_cuda_bad_index():
    w = random_weights(np.random.default_rng(1), gg.Q8_0, 4, 64)
    idx = gg.tensor(np.array([1, 4], np.int32))
    r = gg.get_rows(w, idx)
    with pytest.raises(gg.BackendError, match="get_rows"):
        gg.build_forward(r, backends=("cuda",)).compute()


# ---- the normalizing mat-vec: rms_norm(x) * w -> W·h in one step (a stacked QKV) -----------------
def _norm_case(rng, dt, rows, k):
    ctx = gg.Context()
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    nw = rng.standard_normal(k).astype(np.float32)
    w = random_weights(rng, dt, rows, k, ctx)
    y = gg.mul_mat(w, gg.mul(gg.rms_norm(ctx.tensor(x), 1e-5), ctx.tensor(nw)))
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * nw
    return y, (h @ w.numpy().astype(np.float64).T).reshape(-1)


def _norm_kernel(w) -> str:
    """The normalizing one-product step's kernel: the streaming build's _norm variant where the
    weights stream (blocks.STREAM_NORM), else mul_mat_sibq_norm_* (its _small build for small 4-bit
    matrices, blocks.small_siblings)."""
    if blocks.STREAM_NORM and blocks.streams(w):
        return blocks.vecs_name(w.dtype, blocks.vecs(w.dtype, w.ne[1], w.ne[0], norm=True).R, norm=True)
    return f"mul_mat_sibq_norm_{w.dtype.name}_f32{blocks.qx(w.dtype)}{'_small' if blocks.small_siblings([w]) else ''}"


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("stream_norm", [False, True])
def test_norm_mul_mat_quantized_is_one_step(dt, rng, stream_norm, monkeypatch):
    monkeypatch.setattr(blocks, "STREAM_NORM", stream_norm)
    y, _ = _norm_case(rng, dt, 6144, 4096)
    (s,) = gg.build_forward(y, backends=("cuda", "cpu")).plan.steps
    assert s.ops == ("rms_norm", "mul", "mul_mat") and s.kernel == _norm_kernel(y.src[0])
    assert s.kernel.startswith("mul_mat_vecs") == (stream_norm and dt in blocks.STREAM_TYPES)


@pytest.mark.parametrize("dt", TYPES)
def test_norm_mul_mat_quantized_big_keeps_the_norm_a_step(dt):
    """Rows enough that every block re-reading the norm's weight costs more than the norm's step
    (the streaming build's blocks of 16 rows of K = 4096: more than 24576 rows; planning only)."""
    ctx = gg.Context()
    w, x, nw = ctx.new_tensor(dt, (4096, 32768)), ctx.new_tensor(gg.F32, (4096,)), ctx.new_tensor(gg.F32, (4096,))
    y = gg.mul_mat(w, gg.mul(gg.rms_norm(x, 1e-5), nw))
    steps = gg.build_forward(y, backends=("cuda", "cpu")).plan.steps
    assert [s.ops for s in steps] == [("rms_norm", "mul"), ("mul_mat",)]


@pytest.mark.cuda
@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("rows,k", [(6144, 4096), (1029, 2304), (963, 512), (600, 8448)])
@pytest.mark.parametrize("stream_norm", [False, True])
def test_norm_mul_mat_quantized_cuda(dt, rows, k, rng, stream_norm, monkeypatch):
    """Normalized on the way in: mul_mat_sibq_norm_*, or the streaming build's _norm variant (4-bit
    types above MVS_MIN_ELEMENTS; K = 8448 in 3 parts, whose sums of squares meet in the last block)."""
    monkeypatch.setattr(blocks, "STREAM_NORM", stream_norm)
    y, want = _norm_case(rng, dt, rows, k)
    g = gg.build_forward(y, backends=("cuda",))
    assert [s.kernel for s in g.plan.steps] == [_norm_kernel(y.src[0])]
    g.compute()
    fused = y.numpy().reshape(-1)
    gp = gg.build_forward(y, backends=("cuda",), fuse=False)
    gp.compute()
    assert nmse(fused, y.numpy().reshape(-1)) <= nmse_fused_vs_plain(g, gp)
    assert nmse(fused, want) <= nmse_vs_reference(g)


def test_one_column_rows_per_block():
    """mul_mat_vec1 takes MV1_ROWS rows a block (2 for the 4-bit types: only small matrices reach
    it), the sibling products MV_ROWS (8): SmolLM2's 576-wide rows give 3 slots of 2 = 6 rows a
    block (96 blocks for 576 rows), the siblings 24; several columns keep MV_ROWS_MULTI."""
    for dt in (gg.Q4_0, gg.Q4_1):
        assert blocks.matvec_rows(dt, 576, 1) == 6 and blocks.matvec_rows(dt, 576, 1, sibling=True) == 24
        assert blocks.matvec_grid(dt, 576, 576, 1)[0] == (96, 1, 1)
        assert blocks.matvec_rows(dt, 4096, 1) == 2 and blocks.matvec_rows(dt, 4096, 3) == blocks.MV_ROWS_MULTI
    assert blocks.matvec_rows(gg.Q6_K, 4096, 1) == blocks.matvec_rows(gg.Q6_K, 4096, 1, sibling=True) == 6


def test_small_matrices_keep_the_item_mat_vec():
    """Below blocks.MVS_MIN_ELEMENTS (SmolLM2's 576-wide layers) the streaming build measured
    slower in a whole token: those products stay on mul_mat_vec1."""
    small, big = gg.new_tensor(gg.Q4_1, (1536, 576)), gg.new_tensor(gg.Q4_1, (4096, 1024))
    assert blocks.matvec1_symbol(small) == "mul_mat_vec1_q4_1_f32_qx"
    assert blocks.matvec1_symbol(big).startswith("mul_mat_vecs")


@pytest.mark.compile_all
def test_streaming_launches_fit_their_kernels(rng, monkeypatch):
    """The packed arguments of mul_mat_vecs<R>_* (with and without the residual) match the CUBIN
    signatures (NVRTC, no GPU)."""
    from test_kernel_contract import _lowered, mismatch
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    graphs = []
    for dt in blocks.STREAM_TYPES:
        ctx = gg.Context()
        w = random_weights(rng, dt, 300, 4096, ctx)
        x = ctx.tensor(rng.standard_normal(4096).astype(np.float32))
        r = ctx.tensor(rng.standard_normal(300).astype(np.float32))
        graphs += [gg.build_forward(gg.add(gg.mul_mat(w, x), r), backends=("cuda",)),
                   gg.build_forward(gg.mul_mat(w, x), backends=("cuda",))]
    rt, records = _lowered(graphs)
    assert all(rec.name.startswith("mul_mat_vecs") for rec in records) and len(records) == 2 * len(blocks.STREAM_TYPES)
    assert not [m for rec in records if (m := mismatch(rt, rec))]
