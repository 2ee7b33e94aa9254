"""The CUDA lowering's fast paths, each checked to be the one that ran (the launches are recorded)
and compared with float64 numpy: the wide mat-vec (a block per weight row), the register builds
of rms_norm/norm, the softmax row orders for a mask shared by all heads, and the casts of
cuBLAS operands folded into rms_norm and into a cont. Plus the invariant the overlapped (PDL)
launches rely on: every kernel first waits for the one before it."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from reference import ref_mul_mat, ref_norm, ref_rms_norm
from reference_helpers import nmse

cuda = pytest.mark.cuda


@pytest.fixture
def launches(monkeypatch):
    """Names of the kernels the CUDA lowering launches while the test runs."""
    from gg.backends.cuda import launch
    names: list[str] = []
    real = launch.Launch.__init__

    def recorded(self, rt, file, name, *args, **kwargs):
        names.append(name)
        real(self, rt, file, name, *args, **kwargs)
    monkeypatch.setattr(launch.Launch, "__init__", recorded)
    return names


def rand(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


@cuda
@pytest.mark.parametrize("k", [2048, 2056, 4104])  # one round of loads, a partial one, several
@pytest.mark.parametrize("adt", [gg.F32, gg.F16, gg.BF16])
@pytest.mark.parametrize("bdt", [gg.F32, gg.F16])
def test_wide_matvec(rng, launches, k, adt, bdt):
    a = rand(rng, 2, 37, k)        # ne (k, 37, 2): two heads of weights ...
    b = rand(rng, 1, 4, 1, k)      # ... broadcast over b's 4 (GQA-style division)
    ctx = gg.Context()
    at, bt = ctx.tensor(a, dtype=adt), ctx.tensor(b, dtype=bdt)
    y = gg.mul_mat(at, bt)
    gg.build_forward(y, backends=("cuda",)).compute()
    assert launches == [f"mul_mat_vecw_{adt.name}_{bdt.name}"]
    ref = ref_mul_mat(at.numpy(), bt.numpy())  # the operands as stored (rounded to F16/BF16)
    assert nmse(y.numpy(), ref.reshape(y.numpy().shape)) <= 1e-7


@cuda
def test_wide_matvec_with_residual(rng, launches):
    ctx = gg.Context()
    w, x, r = ctx.tensor(rand(rng, 300, 4096, dtype=np.float16)), ctx.tensor(rand(rng, 1, 4096)), ctx.tensor(rand(rng, 1, 300))
    y = gg.add(gg.mul_mat(w, x), r)
    gg.build_forward(y, backends=("cuda",)).compute()
    assert launches == ["mul_mat_vecw_f16_f32"]
    ref = ref_mul_mat(w.numpy(), x.numpy()) + r.numpy().astype(np.float64)
    assert nmse(y.numpy(), ref.reshape(y.numpy().shape)) <= 1e-7


@cuda
@pytest.mark.parametrize("k", [2048, 2056, 4104, 264, 576, 1032])
@pytest.mark.parametrize("adt", [gg.F32, gg.F16, gg.BF16])
def test_wide_matvec_normalizes_its_input(rng, launches, k, adt):
    """rms_norm(x) * w -> W·h runs as one mat-vec launch (short rows: a narrower block); equal
    to the reference and to the unfused steps."""
    ctx = gg.Context()
    x, w = ctx.tensor(rand(rng, 1, k) * 3.0), ctx.tensor(rand(rng, k))
    wm = ctx.tensor(rand(rng, 301, k), dtype=adt)  # 301 rows: a last block of 5 (8 per block) or 1 (2 or 4)
    y = gg.mul_mat(wm, gg.mul(gg.rms_norm(x, 1e-5), w))
    g = gg.build_forward(y, backends=("cuda",))
    g.compute()
    loads = k // (16 // adt.size)  # 16-byte loads per weight row: the block has at most that many threads
    threads = 256 if loads >= 256 else 128 if loads >= 128 else 64 if loads >= 64 else 32
    assert launches == [f"mul_mat_vecw_norm_{adt.name}_f32" if threads == 256
                        else f"mul_mat_vecw{threads}_norm_rows_{adt.name}_f32"]
    got = y.numpy().copy()
    xs = x.numpy().astype(np.float64)
    h = (ref_rms_norm(xs, 1e-5) * w.numpy()).astype(np.float32)
    assert nmse(got, ref_mul_mat(wm.numpy(), h).reshape(got.shape)) <= 1e-7
    gg.build_forward(y, backends=("cuda",), fuse=False).compute()
    assert nmse(got, y.numpy()) <= 1e-10


@cuda
@pytest.mark.parametrize("ne0,threads", [(64, 32), (1024, 256), (4096, 256), (4104, 512), (16384, 512)])
@pytest.mark.parametrize("dtype", [gg.F32, gg.F16, gg.BF16])
def test_norm_register_builds(rng, launches, ne0, threads, dtype):
    x, w, c = rand(rng, 2, 3, ne0) * 2, rand(rng, ne0), rand(rng, 3, ne0)  # c: a row per i1
    ctx = gg.Context()
    xt = ctx.tensor(x, dtype=dtype)
    y = gg.add(gg.mul(gg.rms_norm(xt, 1e-6), ctx.tensor(w)), ctx.tensor(c))
    z = gg.norm(xt, 1e-5)
    gg.build_forward(y, z, backends=("cuda",)).compute()
    dt = dtype.name
    assert sorted(launches) == sorted([f"rms_norm_reg{threads}_{dt}_{dt}", f"norm_reg{threads}_{dt}_{dt}"])
    x64 = xt.numpy().astype(np.float64)
    ref = ref_rms_norm(x64, 1e-6) * w + c[None]
    zref = ref_norm(x64, 1e-5)
    limit = 1e-7 if dtype is gg.F32 else 1e-5  # F16/BF16 results are rounded on store
    assert nmse(y.numpy().astype(np.float64), ref) <= limit
    assert nmse(z.numpy().astype(np.float64), zref) <= limit


@cuda
@pytest.mark.parametrize("ne0", [5, 64, 1030, 2048])
@pytest.mark.parametrize("mask_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("order", ["rows", "heads", "tiles"])
@pytest.mark.parametrize("ne3", [1, 2])
def test_soft_max_shared_mask_every_order(rng, monkeypatch, ne0, mask_dtype, order, ne3):
    # The order is picked from the L2 size; the test picks it by setting that size: row order
    # (huge L2), heads fastest (no L2; also what ne3 > 1 gets instead of tiles), or tiles of 2
    # rows (a tile's x, y and mask rows just within a quarter of L2).
    from gg.backends.cuda import runtime
    row = ne0 * 8 + ne0 * np.dtype(mask_dtype).itemsize
    l2 = {"rows": 1 << 40, "heads": 0, "tiles": 4 * 2 * row}[order]
    monkeypatch.setattr(runtime.get(), "l2_bytes", l2)
    x = rand(rng, ne3, 5, 6, ne0) * 3                    # ne (ne0, 6, 5, ne3)
    m = rand(rng, 1, 1, 7, ne0).astype(mask_dtype)       # ne (ne0, 7, 1, 1): shared by heads, ne1 >= 6
    m[0, 0, 1, : ne0 // 2] = -np.inf
    ctx = gg.Context()
    y = gg.soft_max_ext(ctx.tensor(x), ctx.tensor(m), scale=0.7)
    gg.build_forward(y, backends=("cuda",)).compute()
    s = x.astype(np.float64) * 0.7 + m[:, :, :6].astype(np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    assert nmse(y.numpy().reshape(x.shape), e / e.sum(-1, keepdims=True)) <= 1e-6


@pytest.mark.parametrize("n, heads, ne3, order", [
    (2048, 32, 1, ("tiles", 512)), (4096, 16, 1, ("tiles", 256)), (1024, 64, 1, "rows"),
    (2048, 16, 2, "heads"), (2046, 32, 1, ("tiles", 2))])
def test_soft_max_row_order_choice(n, heads, ne3, order):
    # No device needed: the choice reads shapes and the L2 size (the H100's 50 MiB here).
    from types import SimpleNamespace
    from gg.backends.cuda.families.softmax import row_order as _softmax_row_order
    x = gg.Context().new_tensor(gg.F32, (n, n, heads, ne3))
    m = gg.Context().new_tensor(gg.F32, (n, n))
    y = gg.soft_max_ext(x, m, scale=0.125)
    descs = _softmax_row_order(SimpleNamespace(l2_bytes=50 << 20), y, x, m, -1, 0.0)
    ne, nb = descs(x)
    if order == "rows":
        assert (ne, nb) == (list(x.ne), list(x.nb))
    elif order == "heads":
        assert ne == [n, heads, n, ne3] and nb == [x.nb[0], x.nb[2], x.nb[1], x.nb[3]]
    else:
        g = order[1]
        assert ne == [n, g, heads, n // g] and nb == [4, x.nb[1], x.nb[2], g * x.nb[1]]
        assert descs(m) == ([n, g, 1, n // g], [4, m.nb[1], m.nb[2], g * m.nb[1]])
    # the causal and ALiBi forms read the row index: always row order
    tiny_l2 = SimpleNamespace(l2_bytes=0)
    assert _softmax_row_order(tiny_l2, y, x, m, 5, 0.0)(x) == (list(x.ne), list(x.nb))
    assert _softmax_row_order(tiny_l2, y, x, m, -1, 8.0)(x) == (list(x.ne), list(x.nb))


@cuda
@pytest.mark.parametrize("wdt", [np.float16, "bf16"])
def test_rms_norm_writes_the_gemm_operand(rng, launches, wdt):
    """The cast of a cuBLAS operand folded into rms_norm * w: the register build writes F16/BF16."""
    ctx = gg.Context()
    x, w = ctx.tensor(rand(rng, 40, 4096)), ctx.tensor(rand(rng, 4096))
    weight = rand(rng, 96, 4096) * 0.02
    wt = ctx.tensor(weight.astype(np.float16)) if wdt is np.float16 else ctx.tensor(weight, dtype=gg.BF16)
    y = gg.mul_mat(wt, gg.mul(gg.rms_norm(x, 1e-6), w))
    g = gg.build_forward(y, backends=("cuda",))
    g.compute()
    if not any(s.ops == ("mul_mat",) and s.kernel.startswith("cublas") for s in g.plan.steps):
        pytest.skip("nvmath-python (cuBLAS) is not installed: no F16 operand cast to fold")
    dt = "f16" if wdt is np.float16 else "bf16"
    assert [s.ops for s in g.plan.steps][0] == ("rms_norm", "mul", "cast") and f"rms_norm_reg256_f32_{dt}" in launches
    h = ref_rms_norm(x.numpy().astype(np.float64), 1e-6) * w.numpy()
    ref = ref_mul_mat(wt.numpy(), h)
    assert nmse(y.numpy(), ref.reshape(y.numpy().shape)) <= 5e-4


@cuda
def test_cont_writes_the_gemm_operand(rng, launches):
    """A cast folded through a reshape into the cont of permuted heads: one cpy_f32_f16 from the
    permuted source, the result equal to the unfused cont -> cast (bit-exact: one rounding)."""
    results = []
    for fuse in (True, False):
        ctx = gg.Context()
        kqv = ctx.tensor(rand(np.random.default_rng(3), 6, 40, 32))
        flat = gg.reshape(gg.cont(gg.permute(kqv, 0, 2, 1, 3)), 32 * 6, 40)
        wo = ctx.tensor(rand(np.random.default_rng(4), 128, 32 * 6).astype(np.float16))
        y = gg.mul_mat(wo, flat)
        g = gg.build_forward(y, backends=("cuda",), fuse=fuse)
        g.compute()
        if not any(s.kernel.startswith("cublas") for s in g.plan.steps):
            pytest.skip("nvmath-python (cuBLAS) is not installed: no F16 operand cast to fold")
        results.append(y.numpy())
        if fuse:
            assert [s.ops for s in g.plan.steps][0] == ("cont", "cast") and launches[0] == "cpy_f32_f16"
            ref = ref_mul_mat(wo.numpy(), np.transpose(kqv.numpy(), (1, 0, 2)).reshape(40, 192))
            assert nmse(y.numpy(), ref) <= 5e-4
    assert np.array_equal(results[0], results[1])


def test_every_kernel_waits_for_its_predecessor_first():
    """gg launches its kernels with programmatic stream serialization on sm_90+ (launch.py), which
    is only safe if each kernel's first statement waits for the kernel before it: gg_grid_sync(),
    after at most one call of an L2 prefetch helper (common.cuh gg_l2_prefetch: no data moves), or
    the mat-vecs that wait themselves after reading only weights no step writes (launch.unwritten):
    the quantized ones (quant.cu mvs_impl, and mv_run through mul_mat_vec_impl / sibq_impl;
    test_quant_ops.py checks both orders give the same bits) and the float ones (mul_mat.cu
    mmv_impl / mmvw_impl, siblings.cu sib_impl; test_float_matvecs_early_loads_change_nothing),
    and the epilogue step that reads its positions and cache rows first (siblings.cu
    epi_rows_impl: inputs no step writes). A measuring build's clock stamp (attn.cu fa_stamp,
    compiled to nothing by default) may come first: it reads no data."""
    import re
    from gg.backends.cuda.compiler import KERNEL_DIR
    entries = 0
    first = re.compile(r"(fa_stamp\(\d+\);[\s\\]*)?(\w*l2_prefetch(<[^;]*>)?\([^;]*\);[\s\\]*)?(gg_grid_sync\(\);|(mvs|mul_mat_vec|sibq|mmv|mmvw|sib)_impl<|epi_rows_impl\()")
    for path in sorted(KERNEL_DIR.glob("*.cu")):
        text = path.read_text()
        for m in re.finditer(r'extern "C" __global__[^{]*\{', text):
            body = text[m.end():].lstrip(" \t\\\n")
            assert first.match(body), f"{path.name}: {m.group(0)[:80]!r} starts with {body[:40]!r}"
            entries += 1
    assert entries >= 17
    for name, file in (("mmv_impl", "mul_mat.cu"), ("mmvw_impl", "mul_mat.cu"), ("sib_impl", "siblings.cu"),
                       ("mv_run", "quant.cu"), ("mvs_impl", "quant.cu"),
                       ("epi_rows_impl", "siblings.cu")):  # ... and those do wait
        text = (KERNEL_DIR / file).read_text()
        start = text.index("{", re.search(rf"void {name}\(", text).end())
        depth, end = 0, start
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        body = text[start:end]
        assert "gg_grid_sync();" in body or "gg_grid_wait();" in body, f"{file} {name} never waits for its predecessor"


@cuda
def test_l2_prefetch_changes_nothing(monkeypatch):
    """The fast flash builds, and where switched on the wide mat-vec and the sibling mat-vecs,
    prefetch into L2 before their wait: the results are bit-identical with the prefetch off
    (launch.L2_PREFETCH), GQA and several tokens included."""
    from gg.backends.cuda import launch
    from gg.backends.cuda.families import matmul, siblings
    from test_flash import Case, compute
    outs = []
    for on in (True, False):
        monkeypatch.setattr(launch, "L2_PREFETCH", on)
        monkeypatch.setattr(matmul, "MMVW_L2_PREFETCH", on)
        monkeypatch.setattr(siblings, "L2_PREFETCH", on)
        case = Case(128, 1000, 8, 2, 2, n_ctx=1024, seed=5)
        _, out = compute(case)
        ctx = gg.Context()
        rng = np.random.default_rng(6)
        w, x = ctx.tensor(rand(rng, 4100, 4096, dtype=np.float16)), ctx.tensor(rand(rng, 4096))
        y = gg.mul_mat(w, x)
        # two products of one x: a sibling step (mul_mat_sib_*)
        wg, wu, x2 = (ctx.tensor(rand(rng, 1030, 2048, dtype=np.float16)),
                      ctx.tensor(rand(rng, 1030, 2048, dtype=np.float16)), ctx.tensor(rand(rng, 2048)))
        g, u = gg.mul_mat(wg, x2), gg.mul_mat(wu, x2)
        graph = gg.build_forward(y, g, u, backends=("cuda",))
        assert any(s.kernel.startswith("mul_mat_sib_") for s in graph.plan.steps)
        graph.compute()
        outs.append((out.numpy(), y.numpy(), g.numpy(), u.numpy()))
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


@cuda
def test_float_matvecs_early_loads_change_nothing(monkeypatch, launches):
    """The float mat-vecs (mul_mat_vec1 / mul_mat_vec, the wide and normalizing mul_mat_vecw
    builds, the sibling steps) load their first weights before waiting for the kernel before
    (launch.EARLY_FLOAT_LOADS) or after it: the same bits, over two computes with a new x. A
    SmolLM2-sized F16 chain (norm + QKV siblings, Wo + residual, norm + SwiGLU siblings, down +
    residual), a 3-column product, and 4096-wide rows (plain and normalized)."""
    from gg.backends.cuda import launch
    early = []
    real = launch.early_loads
    monkeypatch.setattr(launch, "early_loads", lambda step, *w: early.append(real(step, *w)) or early[-1])
    rng = np.random.default_rng(11)
    ctx = gg.Context()
    K, F, W = 576, 1536, 4096
    f16 = lambda *shape: ctx.tensor(rand(rng, *shape, dtype=np.float16))  # noqa: E731
    wq, wk, wv, wo, wg, wu, wd = f16(K, K), f16(192, K), f16(192, K), f16(K, K), f16(F, K), f16(F, K), f16(K, F)
    nw, nw2, nw4 = (ctx.tensor(rand(rng, n)) for n in (K, K, W))
    xt, x4 = ctx.tensor(rand(rng, K)), ctx.tensor(rand(rng, W))
    hn = gg.mul(gg.rms_norm(xt, 1e-5), nw)
    q, k, v = (gg.mul_mat(w, hn) for w in (wq, wk, wv))
    h = gg.add(gg.mul_mat(wo, q), xt)
    hn2 = gg.mul(gg.rms_norm(h, 1e-5), nw2)
    f = gg.add(gg.mul_mat(wd, gg.mul(gg.silu(gg.mul_mat(wg, hn2)), gg.mul_mat(wu, hn2))), h)
    y3 = gg.mul_mat(f16(96, K), ctx.tensor(rand(rng, 3, K)))
    yw = gg.mul_mat(f16(300, W), x4)
    yn = gg.mul_mat(f16(257, W), gg.mul(gg.rms_norm(x4, 1e-5), nw4))
    outs = (q, k, v, f, y3, yw, yn)
    xs = [(rand(rng, K), rand(rng, W)) for _ in range(2)]
    got = []
    for on in (True, False):
        monkeypatch.setattr(launch, "EARLY_FLOAT_LOADS", on)
        early.clear()
        launches.clear()
        g = gg.build_forward(*outs, backends=("cuda",))
        for xa, xb in xs:
            xt.set(xa)
            x4.set(xb)
            g.compute()
            got.append([o.numpy().copy() for o in outs])
        assert any(n.startswith("mul_mat_sib_norm_f16") for n in launches), launches
        assert any(n.startswith("mul_mat_sib_norm_silu_f16") for n in launches), launches
        assert {"mul_mat_vec1_f16_f32", "mul_mat_vec_f16_f32", "mul_mat_vecw_f16_f32"} <= set(launches), launches
        assert any(n.startswith("mul_mat_vecw") and "_norm" in n for n in launches), launches
        # every product's weights are leaves; the plan's first step never reads early
        assert len(early) == len(g.plan.steps) and early[0] == 0 and all(e == on for e in early[1:]), early
    for a, b in ((got[0], got[2]), (got[1], got[3])):
        for u, w in zip(a, b):
            np.testing.assert_array_equal(u, w)


def test_float_early_loads_rule(monkeypatch):
    """launch.early_loads: 1 for weights no step writes, not behind a normalization step (a
    normalizing product is none) and not in the plan's first step; 0 with launch.EARLY_FLOAT_LOADS
    or EARLY_WEIGHTS off."""
    from gg.backends.cuda import launch
    from plan_stubs import check_early_read_rule
    w = gg.Context().new_tensor(gg.F16, (576, 64))
    check_early_read_rule(launch.early_loads, w, 1, (launch, "EARLY_FLOAT_LOADS"), monkeypatch)


def test_short_rows_share_a_warp():
    """Row gathers/scatters of rows shorter than a warp give each row exactly its width in
    threads (narrow), so a warp spans several rows; wider rows keep whole warps."""
    from gg.backends.cuda.launch import rows_config
    assert rows_config(1, 4096, split=True, narrow=True) == ((16, 1, 1), (1, 256, 1))
    assert rows_config(5, 100, split=True, narrow=True) == ((2, 1, 1), (5, 51, 1))
    assert rows_config(1, 4096, split=True) == ((512, 1, 1), (32, 8, 1))
    assert rows_config(4096, 1, split=True, narrow=True) == rows_config(4096, 1, split=True)
