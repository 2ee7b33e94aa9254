"""Randomized sweeps (hypothesis) of every op and fused step of DESIGN §2 against the float64
references of tests/reference.py, with DESIGN §7's NMSE limits.

Each sweep draws a case (shapes with 1s and odd sizes up to ~1100 per dim, total elements bounded;
dtypes; contiguous, permuted, transposed, strided and byte-offset view inputs; ggml repeat-broadcast
shapes), builds the graph in a fresh context, computes it on one backend and compares with the
reference. Data are random and never zero.

Budget and reproducibility (environment):
    GG_SWEEP_EXAMPLES   examples per sweep test and backend (default 40; the CUDA run uses e.g. 200)
    GG_SWEEP_SEED       unset: derandomized (the same cases every run, as CI needs);
                        an integer: random generation from that seed (explore new cases)
The session's summary line "sweeps: N cases on cpu, M on cuda" (tests/conftest.py) counts the
examples that ran and passed. Cases found failing are kept as explicit `@example`s.

Run on a GPU:  GG_SWEEP_EXAMPLES=200 python -m pytest -q tests/test_sweeps.py -m cuda
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

import gg
from reference import (NMSE_BF16, NMSE_ELEMENTWISE, NMSE_F16, NMSE_MUL_MAT, NMSE_NORM, NMSE_SOFTMAX,
                       ROPE_NEOX, ROPE_NORMAL, nmse, ref_add, ref_cpy, ref_diag_mask_inf, ref_div,
                       ref_gelu, ref_get_rows, ref_mul, ref_mul_mat, ref_norm, ref_rms_norm, ref_rope,
                       ref_scale, ref_set_rows, ref_silu, ref_soft_max, ref_sub)
from test_ops import check, limit_for, np_permute, randn, stored

# ---- budget ---------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("GG_SWEEP_EXAMPLES", "40"))
SEED = os.environ.get("GG_SWEEP_SEED")
SWEEP_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not SEED, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.large_base_example])

MAX_DIM = 1100          # largest size of one dim
MAX_ELEMS = 2 ** 18     # largest tensor an example builds (keeps CI fast)

CASES: Counter = Counter()   # examples run and passed, per backend (printed by conftest.py)

BACKENDS = {"cpu": ("cpu",), "cuda": ("cuda", "cpu")}
ON = pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])

F32, F16, BF16, I32 = gg.F32, gg.F16, gg.BF16, gg.I32
FLOATS = (F32, F16, BF16)
STORE = {F32: np.float32, F16: np.float16, BF16: "bf16", I32: np.int32}
REF_BINARY = {"add": ref_add, "sub": ref_sub, "mul": ref_mul, "div": ref_div}


def sweep(fn):
    """@given(case=...) under the sweep settings (and GG_SWEEP_SEED when set)."""
    fn = SWEEP_SETTINGS(fn)
    if SEED:
        fn = seed(int(SEED))(fn)
    return fn


# ---- strategies: sizes, shapes, layouts --------------------------------------------------------------

SPECIAL = (1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 257, 511, 512, 513,
           1023, 1024, 1025, 1100)


def size(hi: int, lo: int = 1):
    """One dim: a 'special' size (1, powers of two and their neighbours, 1025 ...) or any size."""
    hi = max(lo, min(hi, MAX_DIM))
    special = [v for v in SPECIAL if lo <= v <= hi]
    ints = st.integers(lo, hi)
    return st.one_of(st.sampled_from(special), ints) if special else ints


@st.composite
def shapes(draw, max_elems=MAX_ELEMS, n_dims=None, min_dims=1):
    """ne (ggml order, 4 entries): 1..4 dims drawn in random order within the element budget."""
    nd = draw(st.integers(min_dims, 4)) if n_dims is None else n_dims
    order = draw(st.permutations(range(nd)))
    ne = [1, 1, 1, 1]
    budget = max_elems
    for i in order:
        ne[i] = draw(size(budget))
        budget //= ne[i]
    return tuple(ne)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def repeat_shapes(draw, ne):
    """A shape that ggml-repeats over ne: every dim a divisor (1, all, or in between)."""
    return tuple(draw(st.sampled_from([1, n] + divisors(n)[1:-1])) for n in ne)


@dataclass(frozen=True)
class Layout:
    """How an input of logical ne is made: a (possibly strided, byte-offset) view of a bigger
    contiguous base, then a permute (ggml convention: src dim i goes to position perm[i])."""
    kind: str = "contig"             # contig | view | permute | transpose | view+permute
    perm: tuple = (0, 1, 2, 3)
    start: tuple = (0, 0, 0, 0)      # first element of the view, per dim of the base
    step: tuple = (1, 1, 1, 1)       # element step per dim (step[0] is 1: views keep nb[0])
    extra: tuple = (0, 0, 0, 0)      # unused elements after the view, per dim of the base


CONTIG = Layout()
KINDS = ("contig", "view", "permute", "transpose", "view+permute")


def _base_ne(lay: Layout, ne) -> list[int]:
    u = [ne[lay.perm[i]] for i in range(4)]
    return [lay.start[i] + (u[i] - 1) * lay.step[i] + 1 + lay.extra[i] for i in range(4)]


@st.composite
def layouts(draw, ne, rows_contiguous=False, kinds=KINDS):
    """A Layout for logical ne. rows_contiguous keeps nb[0] == element size (dim 0 stays dim 0)."""
    kind = draw(st.sampled_from(kinds))
    perm = (0, 1, 2, 3)
    if kind == "transpose" and not rows_contiguous:
        perm = (1, 0, 2, 3)
    elif "permute" in kind:
        if rows_contiguous:
            perm = (0,) + tuple(draw(st.permutations((1, 2, 3))))
        else:
            perm = tuple(draw(st.permutations(range(4))))
    if "view" not in kind:
        return Layout(kind, perm)
    start = tuple(draw(st.integers(0, 3)) for _ in range(4))
    step = (1,) + tuple(draw(st.sampled_from([1, 2])) for _ in range(3))
    extra = tuple(draw(st.integers(0, 2)) for _ in range(4))
    lay = Layout(kind, perm, start, step, extra)
    n = int(np.prod(ne))
    limit = max(4 * n, 4096)
    for field in ("extra", "step", "start"):   # too much padding: take it back, field by field
        if int(np.prod(_base_ne(lay, ne))) <= limit:
            break
        lay = replace(lay, **{field: (1, 1, 1, 1) if field == "step" else (0, 0, 0, 0)})
    return lay


def make_input(ctx, rng, ne, dtype, lay=CONTIG, lo=None, mag=1.0, shift=0.0, ints=None, post=None,
               persistent=False):
    """(tensor with logical ne made as `lay` says, float64 values it holds as a 4-axis numpy array).
    Float data are random normal (or |x| in [lo, lo + 1.5)), never zero; ints=(lo, hi) for I32."""
    base_ne = _base_ne(lay, ne)
    shape = tuple(base_ne[::-1])
    if dtype is I32:
        x = rng.integers(ints[0], ints[1], size=shape).astype(np.int32)
    else:
        x = randn(rng, shape, lo)
        if mag != 1.0 or shift != 0.0:
            x = (x * np.float32(mag) + np.float32(shift)).astype(np.float32)
            x[x == 0] = np.float32(0.5)
        if post is not None:
            x = post(x)
    if persistent:
        t = ctx.new_tensor(dtype, base_ne, persistent=True)
        t.set(x)
    else:
        t = ctx.tensor(x, dtype=dtype)
    vals = x.astype(np.int64) if dtype is I32 else stored(x, dtype)
    u, uv = t, vals
    if "view" in lay.kind:
        u_ne = [ne[lay.perm[i]] for i in range(4)]
        off = sum(lay.start[i] * t.nb[i] for i in range(4))
        u = gg.view_4d(t, *u_ne, t.nb[1] * lay.step[1], t.nb[2] * lay.step[2], t.nb[3] * lay.step[3], off)
        uv = vals[tuple(slice(lay.start[i], lay.start[i] + (u_ne[i] - 1) * lay.step[i] + 1, lay.step[i])
                        for i in (3, 2, 1, 0))]
    y, yv = u, uv
    if lay.perm != (0, 1, 2, 3):
        y = gg.transpose(u) if lay.kind == "transpose" else gg.permute(u, *lay.perm)
        yv = np_permute(uv, lay.perm)
    assert y.ne == tuple(ne), (y.ne, ne, lay)
    assert yv.shape == tuple(ne[::-1])
    return y, yv


def covered(lay: Layout, ne) -> np.ndarray:
    """Flat indices into the base (in the base's logical order) of the elements of the layout's
    tensor, in the tensor's logical order."""
    base_ne = _base_ne(lay, ne)
    idx = np.arange(int(np.prod(base_ne))).reshape(base_ne[::-1])
    u_ne = [ne[lay.perm[i]] for i in range(4)]
    if "view" in lay.kind:
        idx = idx[tuple(slice(lay.start[i], lay.start[i] + (u_ne[i] - 1) * lay.step[i] + 1, lay.step[i])
                        for i in (3, 2, 1, 0))]
    if lay.perm != (0, 1, 2, 3):
        idx = np_permute(idx, lay.perm)
    return idx.reshape(-1)


def rng_of(case) -> np.random.Generator:
    return np.random.default_rng(case["seed"])


SEEDS = st.integers(0, 2 ** 32 - 1)


def run(backend, *outs, fuse=True):
    """Plan and compute outs on `backend`; returns (graph, list of numpy results)."""
    g = gg.build_forward(*outs, backends=BACKENDS[backend], fuse=fuse)
    if backend == "cuda":  # a silent CPU fallback would make the CUDA sweep pointless
        off = [s for s in g.plan.steps if not s.inserted and s.backend != "cuda"]
        assert not off, f"steps fell back to the CPU:\n{g.plan}"
    g.compute()
    return g, [o.numpy() for o in outs]


def exact(actual, ref):
    check(actual, ref, 0.0)


def ulp(x, dtype) -> np.ndarray:
    """The spacing of `dtype` (F16 / BF16) at |x|, subnormals included."""
    x = np.abs(np.asarray(x, np.float64))
    if dtype is F16:
        return np.maximum(np.spacing(x.astype(np.float16)).astype(np.float64), 2.0 ** -24)
    e = np.floor(np.log2(np.maximum(x, 2.0 ** -126)))
    return 2.0 ** (e - 7)


def check_out(actual, ref, dtype, limit, mag=None, n_ulp=1):
    """check() with NMSE `limit`; for an F16/BF16 result that misses it (a few elements: the NMSE
    is then the relative error of single roundings, which can exceed DESIGN's aggregate limits;
    or values in the F16 subnormal range), every element must instead be within n_ulp units in
    the last place of the result dtype (taken at |mag|, default |ref|)."""
    try:
        check(actual, ref, limit)
        return
    except AssertionError:
        if dtype not in (F16, BF16):
            raise
    a = np.asarray(actual, np.float64).reshape(-1)
    r = np.asarray(ref, np.float64).reshape(-1)
    assert a.size == r.size and not np.isnan(a).any()
    fin = np.isfinite(r)
    np.testing.assert_array_equal(a[~fin], r[~fin])
    m = r if mag is None else np.asarray(mag, np.float64).reshape(-1)
    tol = n_ulp * ulp(m[fin], dtype)
    bad = np.abs(a[fin] - r[fin]) > tol
    assert not bad.any(), (f"NMSE {nmse(a, r):.3e} > {limit:.0e} and {bad.sum()} of {bad.size} elements "
                           f"are more than {n_ulp} ulp of {dtype.name} off, e.g. {a[fin][bad][:4]} vs "
                           f"{r[fin][bad][:4]}")


# ---- binary ops with broadcasting -----------------------------------------------------------------

@st.composite
def binary_cases(draw):
    ne = draw(shapes())
    ne_b = draw(repeat_shapes(ne))
    return dict(op=draw(st.sampled_from(["add", "sub", "mul", "div"])), ne=ne, ne_b=ne_b,
                da=draw(st.sampled_from(FLOATS)), db=draw(st.sampled_from(FLOATS)),
                lay_a=draw(layouts(ne)), lay_b=draw(layouts(ne_b)), seed=draw(SEEDS))


def check_binary(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["da"], case["lay_a"])
    b, bv = make_input(ctx, rng, case["ne_b"], case["db"], case["lay_b"], lo=0.5)
    y = getattr(gg, case["op"])(a, b)
    assert y.ne == a.ne and y.dtype is case["da"]
    _, (out,) = run(backend, y)
    check_out(out, REF_BINARY[case["op"]](av, bv), case["da"], limit_for(case["da"]))
    CASES[backend] += 1


@ON
@sweep
@given(case=binary_cases())
# one BF16 element: NMSE = the relative error of one rounding, up to 2^-16 > NMSE_BF16 (ulp fallback)
@example(case=dict(op="add", ne=(1, 1, 1, 1), ne_b=(1, 1, 1, 1), da=BF16, db=BF16, lay_a=CONTIG,
                   lay_b=CONTIG, seed=33052))
def test_sweep_binary(backend, case):
    check_binary(backend, case)


# ---- scale, silu, gelu ----------------------------------------------------------------------------

@st.composite
def unary_cases(draw):
    ne = draw(shapes())
    s = draw(st.sampled_from([1.0, 0.125, -0.37]) | st.floats(0.01, 4.0)) * draw(st.sampled_from([1, -1]))
    return dict(op=draw(st.sampled_from(["scale", "silu", "gelu"])), ne=ne, dt=draw(st.sampled_from(FLOATS)),
                lay=draw(layouts(ne)), s=s, mag=draw(st.sampled_from([1.0, 4.0, 30.0])), seed=draw(SEEDS))


def check_unary(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["dt"], case["lay"], mag=case["mag"])
    if case["op"] == "scale":
        y, ref = gg.scale(a, case["s"]), ref_scale(av, case["s"])
    else:
        y, ref = getattr(gg, case["op"])(a), {"silu": ref_silu, "gelu": ref_gelu}[case["op"]](av)
    _, (out,) = run(backend, y)
    check_out(out, ref, case["dt"], limit_for(case["dt"]))
    CASES[backend] += 1


@ON
@sweep
@given(case=unary_cases())
# silu(-30 x) in F16 is a subnormal: one element, far from NMSE_F16 relative, within 1 ulp
@example(case=dict(op="silu", ne=(1, 1, 1, 1), dt=F16, lay=CONTIG, s=1.0, mag=30.0, seed=4))
def test_sweep_unary(backend, case):
    check_unary(backend, case)


# ---- rms_norm, norm -------------------------------------------------------------------------------

@st.composite
def norm_cases(draw):
    ne = draw(shapes())
    op = draw(st.sampled_from(["rms_norm", "norm"]))
    # eps = 0 only for rms_norm: norm of a row of equal values (ne0 = 1, or F16 ties) is 0/0
    eps = draw(st.sampled_from([1e-6, 1e-5] + ([0.0] if op == "rms_norm" else [])))
    return dict(op=op, ne=ne, dt=draw(st.sampled_from(FLOATS)), lay=draw(layouts(ne)), eps=eps,
                shift=draw(st.sampled_from([0.0, 3.0])), seed=draw(SEEDS))


def check_norm(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["dt"], case["lay"], shift=case["shift"])
    ref = {"rms_norm": ref_rms_norm, "norm": ref_norm}[case["op"]](av, case["eps"])
    _, (out,) = run(backend, getattr(gg, case["op"])(a, case["eps"]))
    check_out(out, ref, case["dt"], limit_for(case["dt"], NMSE_NORM))
    CASES[backend] += 1


@ON
@sweep
@given(case=norm_cases())
def test_sweep_norm(backend, case):
    check_norm(backend, case)


# ---- soft_max, soft_max_ext (mask, scale, ALiBi) ----------------------------------------------------

def masker(rng, frac, full_rows):
    """post-processing of mask data: -inf with probability frac, and whole rows with full_rows."""
    def post(x):
        x = x.copy()
        x[rng.random(x.shape) < frac] = -np.inf
        if full_rows:
            rows = rng.random(x.shape[:-1]) < full_rows
            x[rows] = -np.inf
        return x
    return post


@st.composite
def softmax_cases(draw):
    ne = draw(shapes())
    case = dict(ne=ne, lay=draw(layouts(ne)), mag=draw(st.sampled_from([1.0, 5.0])),
                scale=draw(st.sampled_from([1.0, 0.125]) | st.floats(-2.0, 2.0)), max_bias=0.0,
                mask=None, seed=draw(SEEDS))
    if draw(st.booleans()):
        ne_m = (ne[0], ne[1] + draw(st.sampled_from([0, 0, 1, 3])), draw(st.sampled_from(divisors(ne[2]))),
                draw(st.sampled_from(divisors(ne[3]))))
        case["mask"] = dict(ne=ne_m, dt=draw(st.sampled_from([F32, F16])),
                            lay=draw(layouts(ne_m, rows_contiguous=True)),
                            frac=draw(st.sampled_from([0.0, 0.1, 0.5])),
                            full_rows=draw(st.sampled_from([0.0, 0.0, 0.2])))
        case["max_bias"] = draw(st.sampled_from([0.0, 0.0, 8.0, 2.5]))
    return case


def check_softmax(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], F32, case["lay"], mag=case["mag"])
    m = case["mask"]
    mask = mv = None
    if m is not None:
        mask, mv = make_input(ctx, rng, m["ne"], m["dt"], m["lay"], post=masker(rng, m["frac"], m["full_rows"]))
    y = gg.soft_max_ext(a, mask, scale=case["scale"], max_bias=case["max_bias"])
    _, (out,) = run(backend, y)
    check(out, ref_soft_max(av, mv, scale=case["scale"], max_bias=case["max_bias"]), NMSE_SOFTMAX)
    CASES[backend] += 1


@ON
@sweep
@given(case=softmax_cases())
def test_sweep_soft_max(backend, case):
    check_softmax(backend, case)


# ---- diag_mask_inf ----------------------------------------------------------------------------------

@st.composite
def diag_cases(draw):
    # the reference loops over rows * cols in Python: keep a matrix <= 2^14 elements
    ne01 = draw(shapes(max_elems=2 ** 14, n_dims=2))
    ne = ne01[:2] + draw(shapes(max_elems=max(1, 2 ** 16 // (ne01[0] * ne01[1])), n_dims=2))[:2]
    return dict(ne=ne, dt=draw(st.sampled_from(FLOATS)), lay=draw(layouts(ne)),
                n_past=draw(st.integers(0, ne[0] + 1)), seed=draw(SEEDS))


def check_diag(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["dt"], case["lay"])
    _, (out,) = run(backend, gg.diag_mask_inf(a, case["n_past"]))
    ref = ref_diag_mask_inf(av, case["n_past"])
    check_out(out, ref, case["dt"], limit_for(case["dt"]))   # nmse: -inf at the same places, finite values close
    CASES[backend] += 1


@ON
@sweep
@given(case=diag_cases())
def test_sweep_diag_mask_inf(backend, case):
    check_diag(backend, case)


# ---- rope -------------------------------------------------------------------------------------------

@st.composite
def rope_cases(draw):
    hd = draw(size(512, lo=2))
    n_dims = hd - hd % 2 if draw(st.booleans()) else 2 * draw(st.integers(1, hd // 2))
    # the reference loops over n_tokens * n_dims/2 in Python: keep that <= 4096
    n_tok = draw(size(max(1, 4096 // (n_dims // 2))))
    n_head = draw(size(max(1, 2 ** 16 // (hd * n_tok))))
    ne3 = draw(size(max(1, 2 ** 16 // (hd * n_tok * n_head)))) if draw(st.booleans()) else 1
    ne = (hd, n_head, n_tok, ne3)
    return dict(ne=ne, n_dims=n_dims, dt=draw(st.sampled_from([F32, F16])), lay=draw(layouts(ne)),
                mode=draw(st.sampled_from([ROPE_NORMAL, ROPE_NEOX])),
                base=draw(st.sampled_from([10000.0, 500.0, 1e6])),
                fscale=draw(st.sampled_from([1.0, 0.5, 0.25])),
                pos_max=draw(st.sampled_from([8, 512, 4096])), seed=draw(SEEDS))


def check_rope(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["dt"], case["lay"])
    pv = rng.integers(-3, case["pos_max"], size=case["ne"][2]).astype(np.int32)
    y = gg.rope(a, ctx.tensor(pv), case["n_dims"], mode=case["mode"], freq_base=case["base"],
                freq_scale=case["fscale"])
    _, (out,) = run(backend, y)
    ref = ref_rope(av, pv, case["n_dims"], case["mode"], case["base"], case["fscale"])
    check_out(out, ref, case["dt"], limit_for(case["dt"]))
    if case["n_dims"] < case["ne"][0]:   # the tail passes through unchanged
        n = case["n_dims"]
        np.testing.assert_array_equal(out.reshape(ref.shape)[..., n:], ref[..., n:])
    CASES[backend] += 1


@ON
@sweep
@given(case=rope_cases())
def test_sweep_rope(backend, case):
    check_rope(backend, case)


# ---- mul_mat (GQA broadcast, mixed dtypes, non-contiguous operands) --------------------------------

@st.composite
def mul_mat_cases(draw):
    k = draw(size(MAX_DIM))
    m = draw(size(MAX_ELEMS // k))
    n_max = max(1, min(MAX_ELEMS // k, 2 ** 24 // (k * m)))
    n = draw(st.sampled_from([v for v in (1, 2, 7, 8, 9) if v <= n_max]) | size(n_max))
    a2 = draw(size(max(1, min(MAX_ELEMS // (k * m), MAX_ELEMS // (k * n), 2 ** 24 // (k * m * n)))))
    r2 = draw(st.sampled_from([1, 1, 2, 3, 4]))
    r2 = r2 if k * n * a2 * r2 <= MAX_ELEMS and k * m * n * a2 * r2 <= 2 ** 24 else 1
    a3 = draw(st.sampled_from([1, 1, 2, 3]))
    r3 = draw(st.sampled_from([1, 1, 2]))
    if k * max(m, n) * a2 * r2 * a3 * r3 > MAX_ELEMS or k * m * n * a2 * r2 * a3 * r3 > 2 ** 24:
        a3 = r3 = 1
    ne_a, ne_b = (k, m, a2, a3), (k, n, a2 * r2, a3 * r3)
    return dict(ne_a=ne_a, ne_b=ne_b, da=draw(st.sampled_from(FLOATS)), db=draw(st.sampled_from(FLOATS)),
                lay_a=draw(layouts(ne_a)), lay_b=draw(layouts(ne_b)), seed=draw(SEEDS))


def check_mul_mat(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne_a"], case["da"], case["lay_a"])
    b, bv = make_input(ctx, rng, case["ne_b"], case["db"], case["lay_b"])
    y = gg.mul_mat(a, b)
    assert y.dtype is F32 and y.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
    _, (out,) = run(backend, y)
    check(out, ref_mul_mat(av, bv), NMSE_MUL_MAT)
    CASES[backend] += 1


@ON
@sweep
@given(case=mul_mat_cases())
def test_sweep_mul_mat(backend, case):
    check_mul_mat(backend, case)


# ---- get_rows, set_rows ------------------------------------------------------------------------------

@st.composite
def get_rows_cases(draw):
    # the reference loops over n * ne2 * ne3 rows in Python: keep that <= 2048
    n, ne2, ne3 = draw(shapes(max_elems=2048, n_dims=3))[:3]
    ne0 = draw(size(MAX_ELEMS // (n * ne2 * ne3)))
    n_rows = draw(size(max(1, MAX_ELEMS // (ne0 * ne2 * ne3))))
    ne_a, ne_i = (ne0, n_rows, ne2, ne3), (n, ne2, ne3, 1)
    return dict(ne_a=ne_a, ne_i=ne_i, dt=draw(st.sampled_from(FLOATS + (I32,))), lay_a=draw(layouts(ne_a)),
                lay_i=draw(layouts(ne_i)), seed=draw(SEEDS))


def check_get_rows(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne_a"], case["dt"], case["lay_a"], ints=(-1000, 1000))
    idx, iv = make_input(ctx, rng, case["ne_i"], I32, case["lay_i"], ints=(0, case["ne_a"][1]))
    y = gg.get_rows(a, idx)
    _, (out,) = run(backend, y)
    ref = ref_get_rows(av, iv[0])
    if case["dt"] is I32:
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out.reshape(ref.shape), ref)
    else:
        assert out.dtype == np.float32
        exact(out, ref)   # a gather of decoded values
    CASES[backend] += 1


@ON
@sweep
@given(case=get_rows_cases())
def test_sweep_get_rows(backend, case):
    check_get_rows(backend, case)


@st.composite
def set_rows_cases(draw):
    n, ne2, ne3 = draw(shapes(max_elems=2048, n_dims=3))[:3]
    ne0 = draw(size(MAX_ELEMS // (n * ne2 * ne3)))
    n_rows = draw(size(max(n, MAX_ELEMS // (ne0 * ne2 * ne3)), lo=n))
    ne_d, ne_s = (ne0, n_rows, ne2, ne3), (ne0, n, ne2, ne3)
    ne_i = (n, ne2 // draw(st.sampled_from(divisors(ne2))), ne3 // draw(st.sampled_from(divisors(ne3))), 1)
    return dict(ne_d=ne_d, ne_s=ne_s, ne_i=ne_i, dd=draw(st.sampled_from(FLOATS)),
                ds=draw(st.sampled_from(FLOATS)),
                lay_d=draw(layouts(ne_d, rows_contiguous=True, kinds=("contig", "view"))),
                lay_s=draw(layouts(ne_s)), lay_i=draw(layouts(ne_i)), seed=draw(SEEDS))


def check_set_rows(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    dst, dv = make_input(ctx, rng, case["ne_d"], case["dd"], case["lay_d"], persistent=True)
    root = dst.root
    before_root = stored(root.numpy(), case["dd"]).reshape(-1)
    src, sv = make_input(ctx, rng, case["ne_s"], case["ds"], case["lay_s"])
    n, i2, i3 = case["ne_i"][:3]
    # distinct rows within each (i2, i3): duplicate indices would make the result order-dependent
    iv = np.stack([rng.permutation(case["ne_d"][1])[:n] for _ in range(i2 * i3)]).reshape(i3, i2, n)
    idx = ctx.tensor(iv.astype(np.int32))
    if case["lay_i"].kind != "contig":   # idx read through a view as well
        idx, _ = make_input(ctx, rng, case["ne_i"], I32, case["lay_i"], ints=(0, 1))
        idx_root = idx.root
        pos = covered(case["lay_i"], case["ne_i"])
        raw = np.zeros(idx_root.nelements, np.int32)
        raw[pos] = iv.reshape(-1)
        idx_root.set(raw.reshape(idx_root.ne[::-1]))
    y = gg.set_rows(dst, src, idx)
    _, (out,) = run(backend, y)
    ref = ref_set_rows(dv, sv, iv, dtype=STORE[case["dd"]])
    exact(out, ref)   # rounding to the destination dtype is exact (nearest even) on both sides
    after = root.numpy().astype(np.float64).reshape(-1)
    pos = covered(case["lay_d"], case["ne_d"])
    np.testing.assert_array_equal(after[pos], ref.reshape(-1))   # the write landed in the root
    keep = np.ones(after.size, bool)
    keep[pos] = False
    np.testing.assert_array_equal(after[keep], before_root[keep])   # nothing else touched
    CASES[backend] += 1


@ON
@sweep
@given(case=set_rows_cases())
def test_sweep_set_rows(backend, case):
    check_set_rows(backend, case)


# ---- cpy / cont / cast with dtype conversions ---------------------------------------------------

def reshapes(ne):
    """Shapes with ne's element count: the same, reversed, flat, dims merged, dims shuffled."""
    n = int(np.prod(ne))
    out = [tuple(ne), tuple(ne[::-1]), (n, 1, 1, 1), (ne[0] * ne[1], ne[2], ne[3], 1),
           (ne[0], ne[1] * ne[2], ne[3], 1), (1, n, 1, 1)]
    return st.sampled_from(out) | st.permutations(ne).map(tuple)


@st.composite
def copy_cases(draw):
    ne = draw(shapes())
    op = draw(st.sampled_from(["cpy", "cpy", "cont", "cast"]))
    ints = op != "cast" and draw(st.integers(0, 7)) == 0
    ds = I32 if ints else draw(st.sampled_from(FLOATS))
    dd = I32 if ints else draw(st.sampled_from(FLOATS))
    ne_d = draw(reshapes(ne))
    return dict(op=op, ne=ne, ds=ds, dd=ds if op == "cont" else dd, lay=draw(layouts(ne)), ne_d=ne_d,
                lay_d=draw(layouts(ne_d)), dst_kind=draw(st.sampled_from(["new", "persistent"])),
                seed=draw(SEEDS))


def check_copy(backend, case):
    rng, ctx = rng_of(case), gg.Context()
    a, av = make_input(ctx, rng, case["ne"], case["ds"], case["lay"], ints=(-2 ** 31, 2 ** 31 - 1))
    root = None
    if case["op"] == "cont":
        y, ne_d = gg.cont(a), case["ne"]
    elif case["op"] == "cast":
        y, ne_d = gg.cast(a, case["dd"]), case["ne"]
    else:
        ne_d = case["ne_d"]
        if case["dst_kind"] == "new":
            dst = ctx.new_tensor(case["dd"], ne_d)
        else:   # write through a (permuted, strided, offset) view of a persistent tensor
            dst, _ = make_input(ctx, rng, ne_d, case["dd"], case["lay_d"], ints=(-9, 9), persistent=True)
            root = dst.root
            before = root.numpy().reshape(-1).copy()
        y = gg.cpy(a, dst)
    assert y.dtype is case["dd"] and y.ne == tuple(ne_d)
    if case["op"] != "cpy":
        assert y.is_contiguous()
    _, (out,) = run(backend, y)
    ref = ref_cpy(av, ne_d[::-1], STORE[case["dd"]])
    if case["dd"] is I32:
        np.testing.assert_array_equal(out.reshape(ref.shape), ref)
    else:
        exact(out, ref)   # same dtype: bit-exact; conversions: round to nearest even, exactly
    if root is not None:
        after = root.numpy().reshape(-1)
        pos = covered(case["lay_d"], ne_d)
        np.testing.assert_array_equal(after[pos].astype(np.float64), ref.reshape(-1).astype(np.float64))
        keep = np.ones(after.size, bool)
        keep[pos] = False
        np.testing.assert_array_equal(after[keep], before[keep])
    CASES[backend] += 1


@ON
@sweep
@given(case=copy_cases())
def test_sweep_copy(backend, case):
    check_copy(backend, case)


# ---- fused rms_norm -> mul (-> add) -----------------------------------------------------------------

def fused_and_unfused(backend, build):
    """build(ctx) -> (out tensor, reference); computed with and without fusion in fresh contexts.
    Returns (fused result, unfused result, fused plan ops, reference)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GG_NO_FUSION", raising=False)
        res = []
        for fuse in (True, False):
            y, ref = build(gg.Context())
            g, (out,) = run(backend, y, fuse=fuse)
            res.append((out, [s.ops for s in g.plan.steps if not s.inserted]))
    (fused, ops), (unfused, ops_u) = res
    assert all(len(o) == 1 for o in ops_u), ops_u
    return fused, unfused, ops, ref


@st.composite
def rms_fused_cases(draw):
    ne = draw(shapes())
    ne_w = draw(repeat_shapes(ne))
    ne_c = draw(repeat_shapes(ne)) if draw(st.booleans()) else None
    dt = draw(st.sampled_from(FLOATS))
    return dict(ne=ne, ne_w=ne_w, ne_c=ne_c, dt=dt, dw=draw(st.sampled_from(FLOATS)),
                dc=draw(st.sampled_from(FLOATS)), lay=draw(layouts(ne)), lay_w=draw(layouts(ne_w)),
                lay_c=draw(layouts(ne_c)) if ne_c else CONTIG, eps=draw(st.sampled_from([1e-6, 1e-5])),
                seed=draw(SEEDS))


def check_rms_fused(backend, case):
    def build(ctx):
        rng = rng_of(case)
        x, xv = make_input(ctx, rng, case["ne"], case["dt"], case["lay"])
        w, wv = make_input(ctx, rng, case["ne_w"], case["dw"], case["lay_w"])
        y = gg.mul(gg.rms_norm(x, case["eps"]), w)
        ref = mag = ref_mul(ref_rms_norm(xv, case["eps"]), wv)
        if case["ne_c"] is not None:
            c, cv = make_input(ctx, rng, case["ne_c"], case["dc"], case["lay_c"])
            y, ref = gg.add(y, c), ref_add(ref, cv)
            mag = np.maximum(np.abs(mag), np.abs(ref))
        return y, (ref, mag)

    fused, unfused, ops, (ref, mag) = fused_and_unfused(backend, build)
    want = ("rms_norm", "mul", "add") if case["ne_c"] is not None else ("rms_norm", "mul")
    assert ops == [want], ops
    lim = limit_for(case["dt"], NMSE_NORM)
    if case["dt"] is not F32:   # the unfused graph rounds the intermediates to F16/BF16 as well
        lim *= 3
    check_out(fused, ref, case["dt"], lim, mag=mag, n_ulp=1)
    check_out(unfused, ref, case["dt"], lim, mag=mag, n_ulp=3)
    if case["dt"] is F32:   # (F16/BF16: the fused kernel does not round the intermediates)
        check(fused, unfused, NMSE_NORM if backend == "cuda" else 0.0)
    CASES[backend] += 1


@ON
@sweep
@given(case=rms_fused_cases())
def test_sweep_fused_rms_norm_mul_add(backend, case):
    check_rms_fused(backend, case)


# ---- fused scale -> add(mask) | diag_mask_inf -> soft_max ------------------------------------------

@st.composite
def softmax_fused_cases(draw):
    ne = draw(shapes())
    masking = draw(st.sampled_from(["mask", "diag"]))
    if masking == "diag":   # the diag_mask_inf reference loops over rows * cols in Python
        ne01 = draw(shapes(max_elems=2 ** 14, n_dims=2))
        ne = ne01[:2] + draw(shapes(max_elems=max(1, 2 ** 16 // (ne01[0] * ne01[1])), n_dims=2))[:2]
    ne_m = draw(repeat_shapes(ne))
    return dict(ne=ne, masking=masking, lay=draw(layouts(ne)), mag=draw(st.sampled_from([1.0, 5.0])),
                s=draw(st.sampled_from([0.125, 1.0]) | st.floats(-2.0, 2.0)),
                s2=draw(st.sampled_from([1.0, 1.5]) | st.floats(0.05, 2.0)),
                ne_m=ne_m, dm=draw(st.sampled_from([F32, F16])), lay_m=draw(layouts(ne_m)),
                frac=draw(st.sampled_from([0.0, 0.1, 0.5])), n_past=draw(st.integers(0, ne[0] + 1)),
                seed=draw(SEEDS))


def check_softmax_fused(backend, case):
    def build(ctx):
        rng = rng_of(case)
        x, xv = make_input(ctx, rng, case["ne"], F32, case["lay"], mag=case["mag"])
        s = gg.scale(x, case["s"])
        sv = ref_scale(xv, case["s"])
        if case["masking"] == "mask":
            m, mv = make_input(ctx, rng, case["ne_m"], case["dm"], case["lay_m"],
                               post=masker(rng, case["frac"], 0.0))
            mid, midv = gg.add(s, m), ref_add(sv, mv)
        else:
            mid, midv = gg.diag_mask_inf(s, case["n_past"]), ref_diag_mask_inf(sv, case["n_past"])
        return gg.soft_max_ext(mid, scale=case["s2"]), ref_soft_max(midv, scale=case["s2"])

    fused, unfused, ops, ref = fused_and_unfused(backend, build)
    want = ("scale", "add" if case["masking"] == "mask" else "diag_mask_inf", "soft_max")
    assert ops == [want], ops
    check(fused, ref, NMSE_SOFTMAX)
    check(unfused, ref, NMSE_SOFTMAX)
    check(fused, unfused, NMSE_SOFTMAX if backend == "cuda" else 0.0)
    CASES[backend] += 1


@ON
@sweep
@given(case=softmax_fused_cases())
def test_sweep_fused_scale_mask_soft_max(backend, case):
    check_softmax_fused(backend, case)


# ---- the sweep machinery itself (no backend) -----------------------------------------------------------

@sweep
@given(ne=shapes(), data=st.data())
def test_layouts_match_numpy(ne, data):
    """make_input's float64 values are exactly what gg reads through the view (checked with cont)."""
    lay = data.draw(layouts(ne))
    assert int(np.prod(ne)) <= MAX_ELEMS
    ctx = gg.Context()
    t, tv = make_input(ctx, np.random.default_rng(0), ne, F32, lay)
    assert np.all(tv != 0)
    _, (out,) = run("cpu", gg.cont(t))
    exact(out, tv)
    assert sorted(covered(lay, ne)) == sorted(set(covered(lay, ne).tolist()))   # no element twice
