"""The fused attention step (K·q -> scale -> mask -> softmax -> ·V as one flash-decoding kernel).

Plan tests need no GPU; the `cuda` tests compare the fused kernel with a float64 numpy
reference and with the same graph unfused, on cache-shaped views (strided K; V transposed, or
position-major like K and read through `transpose` or `cont(transpose)`, the cont elided),
GQA/MQA head groups, odd sizes, several chunks, masks of every kind and repeated computes, and a
llama.cpp-style block writing its caches with cpy or set_rows."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda.families import attention
from reference import ref_soft_max, round_bf16
from reference_helpers import nmse

cuda = pytest.mark.cuda
LIMIT = 1e-6  # no F16 rounding of q or of the probabilities: F32 accumulation error only
STORE = {"f32": np.float32, "f16": np.float16}


def flash_steps(plan):
    return [s for s in plan.steps if s.kernel.startswith("flash_attn")]


def stored(a: np.ndarray, dtype: str) -> np.ndarray:
    """a as the cache stores it: float64 of the values rounded to the cache dtype."""
    return round_bf16(a) if dtype == "bf16" else a.astype(STORE[dtype]).astype(np.float64)


class Case:
    """Attention of T query tokens over n_kv cache positions, built like gg.llama's block: K a
    strided view of a (n_ctx, n_head_kv, hd) cache, V (v="t") a view of a transposed (n_head_kv,
    hd, n_ctx) cache, q a permuted view. v="pos": V stored like K (n_head_kv, n_ctx, hd) and read
    through gg.transpose, v="cont": through gg.cont(gg.transpose(...)) (llama.cpp's forms)."""

    def __init__(self, hd, n_kv, nh, nkv, T, dtype="f16", form="add", n_ctx=None, seed=0, v="t", q_scale=0.5):
        self.hd, self.n_kv, self.nh, self.nkv, self.T = hd, n_kv, nh, nkv, T
        self.dtype, self.form, self.v_form = dtype, form, v
        self.n_ctx = n_ctx or n_kv + 3
        rng = np.random.default_rng(seed)
        self.k = rng.standard_normal((self.n_ctx, nkv, hd))
        self.v = rng.standard_normal((nkv, hd, self.n_ctx))
        self.q = rng.standard_normal((T, nh, hd)) * q_scale
        self.n_past = n_kv - T
        cols, rows = np.arange(n_kv), self.n_past + np.arange(T)
        self.mask = np.where(cols[None, :] <= rows[:, None], 0.0, -np.inf)
        self.mask[:, 1::7] = -np.inf  # holes: masked positions inside the visible range
        self.scale = 1.0 / np.sqrt(hd)

    def build(self, ctx):
        gdt = {"f32": gg.F32, "f16": gg.F16, "bf16": gg.BF16}[self.dtype]
        K = ctx.tensor(self.k, dtype=gdt, name="k_cache")
        k = gg.view_3d(K, self.hd, self.n_kv, self.nkv, K.nb[2], K.nb[1], 0)
        if self.v_form != "t":  # V position-major: nb[0] = a row of hd values
            Vr = ctx.tensor(np.ascontiguousarray(self.v.transpose(0, 2, 1)), dtype=gdt, name="v_rows")
            v = gg.view_3d(Vr, self.hd, self.n_kv, self.nkv, Vr.nb[1], Vr.nb[2], 0)  # ne (hd, n_kv, nkv)
            v = gg.transpose(v)  # ne (n_kv, hd, nkv)
            if self.v_form == "cont":
                v = gg.cont(v)
        else:
            V = ctx.tensor(self.v, dtype=gdt, name="v_cache")
            v = gg.view_3d(V, self.n_kv, self.hd, self.nkv, V.nb[1], V.nb[2], 0)
        q = ctx.tensor(self.q, dtype=gg.F32, name="q")
        self.q_leaf = q
        kq = gg.mul_mat(k, gg.permute(q, 0, 2, 1, 3))
        if self.form == "add":
            mask = ctx.tensor(self.mask, dtype=gg.F32, name="mask")
            kq = gg.soft_max(gg.add(gg.scale(kq, self.scale), mask))
        elif self.form == "diag":
            kq = gg.soft_max(gg.diag_mask_inf(gg.scale(kq, self.scale), self.n_past))
        else:  # soft_max_ext with an F16 mask ("ext") or an F32 one ("ext32")
            mask = ctx.tensor(self.mask, dtype=gg.F32 if self.form == "ext32" else gg.F16, name="mask")
            kq = gg.soft_max_ext(kq, mask, scale=self.scale)
        return gg.mul_mat(v, kq)

    def reference(self, q=None) -> np.ndarray:
        q = self.q if q is None else q
        k, v = stored(self.k, self.dtype), stored(self.v, self.dtype)
        r = self.nh // self.nkv
        out = np.zeros((self.nh, self.T, self.hd))
        mask = self.mask if self.form != "diag" else np.where(
            np.arange(self.n_kv)[None, :] <= (self.n_past + np.arange(self.T))[:, None], 0.0, -np.inf)
        for h in range(self.nh):
            g = h // r
            s = q[:, h, :].astype(np.float32).astype(np.float64) @ k[:self.n_kv, g, :].T   # (T, n_kv)
            p = ref_soft_max(s, mask, scale=self.scale)
            out[h] = p @ v[g, :, :self.n_kv].T
        return out


# ---- planning (no GPU) ----------------------------------------------------------------------------
def test_plan_fuses_decode_attention_on_cuda():
    c = Case(64, 100, 8, 2, 1)
    out = c.build(gg.Context())
    plan = gg.build_forward(out, backends=("cuda", "cpu")).plan
    steps = flash_steps(plan)
    assert [s.ops for s in steps] == [("mul_mat", "scale", "add", "soft_max", "mul_mat")], str(plan)
    assert steps[0].kernel.startswith("flash_attn_f16_h") and steps[0].out is out


@pytest.mark.parametrize("n_kv,cluster", [(64, 1), (300, 5), (512, 8), (513, 0), (1000, 0)])
def test_plan_clusters_short_contexts(n_kv, cluster, monkeypatch):
    """A fused step over at most CLUSTER_MAX chunks of positions combines as one cluster a head
    group (the plan records it on any machine; lowering uses it on sm_90+); CLUSTER_MAX = 0: never.
    (FAST_CHUNK positions a block: the short chunk off.)"""
    monkeypatch.setattr(attention, "SHORT_CHUNK", 0)
    c = Case(64, n_kv, 8, 2, 1, n_ctx=-(-n_kv // 8) * 8 + 8)  # rows 16-byte aligned: the fast build
    (step,) = flash_steps(gg.build_forward(c.build(gg.Context()), backends=("cuda", "cpu")).plan)
    assert step.choice.fast and step.choice.cluster == cluster
    monkeypatch.setattr(attention, "CLUSTER_MAX", 0)
    (step,) = flash_steps(gg.build_forward(c.build(gg.Context()), backends=("cuda", "cpu")).plan)
    assert step.choice.cluster == 0 and step.choice.fused == (n_kv <= 1024)


@pytest.mark.parametrize("hd,n_kv,nh,nkv,chunk,cluster", [
    (128, 128, 32, 8, 32, 4),   # llama-3-8B heads at tg128: 8 groups x 2 chunks = 16 blocks
    (128, 512, 32, 8, 64, 8),   # 64 blocks: FAST_CHUNK
    (64, 300, 8, 2, 64, 5),     # 5 chunks of 64 combine in a cluster, 10 of 32 could not: FAST_CHUNK
    (64, 600, 8, 2, 64, 0),     # 19 chunks of 32 would need flash_combine: FAST_CHUNK
    (64, 128, 16, 2, 64, 2),    # 8 heads a block: no short build
])
def test_plan_short_contexts_take_the_short_chunk(hd, n_kv, nh, nkv, chunk, cluster, monkeypatch):
    """Few blocks with FAST_CHUNK positions each (a short context): SHORT_CHUNK positions a
    block, twice the blocks, recorded in the choice and the kernel's name; SHORT_CHUNK = 0: never."""
    c = Case(hd, n_kv, nh, nkv, 1, n_ctx=-(-n_kv // 8) * 8 + 8)
    (step,) = flash_steps(gg.build_forward(c.build(gg.Context()), backends=("cuda", "cpu")).plan)
    k = step.choice
    assert (k.fast, k.chunk, k.cluster, k.fused) == (True, chunk, cluster, True)
    assert step.kernel == attention.fast_symbol("f16", k.heads, hd, False, chunk)
    assert k.scratch == 4 * nh * -(-n_kv // chunk) * (2 + hd) + attention.O_ALIGN
    monkeypatch.setattr(attention, "SHORT_CHUNK", 0)
    (step,) = flash_steps(gg.build_forward(c.build(gg.Context()), backends=("cuda", "cpu")).plan)
    assert step.choice.chunk == attention.FAST_CHUNK and step.kernel.endswith(f"_d{hd}")


def test_short_chunk_keeps_the_combine_of_the_fast_chunk(monkeypatch):
    """Without clusters (CLUSTER_MAX = 0) both chunks combine in the kernel, so 300 positions take
    10 chunks of SHORT_CHUNK; with clusters the 5 of FAST_CHUNK keep theirs."""
    c = Case(64, 300, 8, 2, 1, n_ctx=312)
    plan = lambda: flash_steps(gg.build_forward(c.build(gg.Context()), backends=("cuda", "cpu")).plan)[0].choice
    assert (plan().chunk, plan().cluster) == (attention.FAST_CHUNK, 5)
    monkeypatch.setattr(attention, "CLUSTER_MAX", 0)
    assert (plan().chunk, plan().cluster, plan().fused) == (attention.SHORT_CHUNK, 0, True)


@pytest.mark.parametrize("form,ops", [("diag", ("mul_mat", "scale", "diag_mask_inf", "soft_max", "mul_mat")),
                                      ("ext", ("mul_mat", "soft_max", "mul_mat"))])
def test_plan_fuses_every_form(form, ops):
    out = Case(64, 100, 4, 4, 2, form=form).build(gg.Context())
    assert [s.ops for s in flash_steps(gg.build_forward(out, backends=("cuda", "cpu")).plan)] == [ops]


def test_plan_keeps_prefill_and_cpu_unfused():
    prefill = Case(64, 100, 4, 4, attention.MAX_T + 1).build(gg.Context())
    plan = gg.build_forward(prefill, backends=("cuda", "cpu")).plan
    assert not flash_steps(plan)
    assert ("scale", "add", "soft_max") in [s.ops for s in plan.steps]  # the softmax chain still fuses
    decode = Case(64, 100, 4, 4, 1).build(gg.Context())
    assert not flash_steps(gg.build_forward(decode, backends=("cpu",)).plan)
    assert not flash_steps(gg.build_forward(decode, backends=("cuda", "cpu"), fuse=False).plan)


def test_plan_refuses_when_the_intermediate_is_needed():
    ctx = gg.Context()
    c = Case(64, 100, 4, 4, 1)
    out = c.build(ctx)
    probs = out.src[1]  # the softmax, also an output: it must be materialized
    plan = gg.build_forward(out, probs, backends=("cuda", "cpu")).plan
    assert not flash_steps(plan)


@pytest.mark.parametrize("v", ["pos", "cont"])
@pytest.mark.parametrize("form", ["add", "diag", "ext", "ext32"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa4", "mqa"])
def test_plan_fuses_position_major_v(v, form, heads):
    """Every mask form, MHA/GQA/MQA, V read through transpose or cont(transpose): one flash step on
    the fast position-major build, no cont step left."""
    nh, nkv = heads
    out = Case(128, 100, nh, nkv, 1, form=form, v=v, n_ctx=104).build(gg.Context())
    plan = gg.build_forward(out, backends=("cuda", "cpu")).plan
    (flash,) = flash_steps(plan)
    assert flash.kernel == attention.fast_symbol("f16", attention.heads_per_block(nh, nkv), 128, True,
                                                 flash.choice.chunk), str(plan)
    assert not [s for s in plan.steps if s.ops == ("cont",)] and len(flash.elided) == (v == "cont")


class Block:
    """llama.cpp's decode attention with flash attention on: K and V caches (hd, n_ctx, n_kv_head)
    written at positions n_past.. with cpy into a view or with set_rows, then read as views, V
    through cont(transpose) or transpose; graph built as ggml does (the writes expanded first)."""

    def __init__(self, hd=128, nh=8, nkv=2, T=1, n_past=300, n_ctx=512, write="cpy", v="cont", seed=0):
        self.hd, self.nh, self.nkv, self.T, self.n_past, self.n_ctx = hd, nh, nkv, T, n_past, n_ctx
        self.write, self.v_form = write, v
        rng = np.random.default_rng(seed)
        self.K, self.V = (rng.standard_normal((nkv, n_ctx, hd)) for _ in range(2))
        self.k_cur, self.v_cur = (rng.standard_normal((T, nkv, hd)) for _ in range(2))
        self.q = rng.standard_normal((T, nh, hd)) * 0.5

    def build(self, ctx):
        hd, nkv, T, p = self.hd, self.nkv, self.T, self.n_past
        K = ctx.tensor(self.K, dtype=gg.F16, name="k_cache")
        V = ctx.tensor(self.V, dtype=gg.F16, name="v_cache")
        writes = []
        for cache, cur in ((K, self.k_cur), (V, self.v_cur)):
            x = gg.permute(ctx.tensor(cur.astype(np.float32)), 0, 2, 1, 3)  # ne (hd, T, nkv)
            if self.write == "cpy":
                writes.append(gg.cpy(x, gg.view_3d(cache, hd, T, nkv, cache.nb[1], cache.nb[2], p * cache.nb[1])))
            else:
                idx = ctx.tensor(np.arange(p, p + T, dtype=np.int32))
                writes.append(gg.set_rows(cache, x, idx))
        n_kv = p + T
        k = gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)
        v = gg.transpose(gg.view_3d(V, hd, n_kv, nkv, V.nb[1], V.nb[2], 0))
        if self.v_form == "cont":
            v = gg.cont(v)
        q = gg.permute(ctx.tensor(self.q.astype(np.float32)), 0, 2, 1, 3)
        kq = gg.soft_max(gg.diag_mask_inf(gg.scale(gg.mul_mat(k, q), hd ** -0.5), p))
        out = gg.mul_mat(v, kq)
        return writes, out

    def graph(self, fuse=True):
        writes, out = self.build(gg.Context())
        g = gg.build_forward(*writes, backends=("cuda", "cpu"), fuse=fuse)
        g.build_forward_expand(out)
        return g, out

    def reference(self) -> np.ndarray:
        p, T, n_kv, r = self.n_past, self.T, self.n_past + self.T, self.nh // self.nkv
        k, v = stored(self.K, "f16"), stored(self.V, "f16")
        k[:, p:p + T], v[:, p:p + T] = stored(self.k_cur, "f16").transpose(1, 0, 2), stored(self.v_cur, "f16").transpose(1, 0, 2)
        mask = np.where(np.arange(n_kv)[None, :] <= (p + np.arange(T))[:, None], 0.0, -np.inf)
        out = np.zeros((self.nh, T, self.hd))
        for h in range(self.nh):
            s = self.q[:, h, :].astype(np.float32).astype(np.float64) @ k[h // r, :n_kv].T
            out[h] = ref_soft_max(s, mask, scale=self.hd ** -0.5) @ v[h // r, :n_kv]
        return out


@pytest.mark.parametrize("write", ["cpy", "set_rows"])
@pytest.mark.parametrize("v", ["pos", "cont"])
def test_plan_llama_cpp_block_fuses(write, v):
    g, out = Block(write=write, v=v).graph()
    plan = g.plan
    (flash,) = flash_steps(plan)
    assert flash.kernel == attention.fast_symbol("f16", 4, 128, True, flash.choice.chunk), str(plan)
    assert flash is plan.steps[-1], str(plan)
    assert not [s for s in plan.steps if s.ops == ("cont",)]
    assert [s.ops[0] for s in plan.steps[:2]] == [write] * 2  # the cache writes come first


def test_llama_decode_plan_uses_flash():
    cfg = gg.llama.Config(n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_ctx=64)
    w = gg.llama.Weights.random(cfg)
    cache = gg.llama.KVCache(cfg, w.ctx)
    batch = gg.llama.Batch.indexed(cfg, w.ctx, 1)
    g, _, _ = gg.llama.build_forward_pass(cfg, w, cache, batch, backends=("cuda", "cpu"))
    assert len(flash_steps(g.plan)) == 1, str(g.plan)


# ---- on the GPU -----------------------------------------------------------------------------------
CASES = {
    "mha-f16": dict(hd=128, n_kv=1000, nh=8, nkv=8, T=1, n_ctx=1024),
    "gqa4-odd": dict(hd=64, n_kv=77, nh=8, nkv=2, T=1),
    "mqa-many-chunks": dict(hd=64, n_kv=5000, nh=4, nkv=1, T=3, n_ctx=5008),
    "gqa3-bf16-diag": dict(hd=40, n_kv=300, nh=6, nkv=2, T=2, dtype="bf16", form="diag"),
    "scalar-k-f32-ext": dict(hd=36, n_kv=129, nh=4, nkv=4, T=1, dtype="f32", form="ext"),
    "gqa8-hd256-t8": dict(hd=256, n_kv=700, nh=16, nkv=2, T=8),
    "v-pos-d64": dict(hd=64, n_kv=333, nh=4, nkv=2, T=1, v="pos"),
    "v-pos-d128-gqa4-odd": dict(hd=128, n_kv=1000, nh=32, nkv=8, T=1, n_ctx=1024, v="pos"),
    "v-cont-d128-gqa4-odd": dict(hd=128, n_kv=1000, nh=32, nkv=8, T=1, n_ctx=1024, v="cont"),
    "v-cont-d64-mqa-diag": dict(hd=64, n_kv=777, nh=8, nkv=1, T=2, form="diag", v="cont"),
    "v-pos-d128-mqa-bf16-ext32": dict(hd=128, n_kv=130, nh=8, nkv=1, T=1, dtype="bf16", form="ext32", v="pos"),
    "v-cont-d64-ext-f16-h8-t8": dict(hd=64, n_kv=4099, nh=16, nkv=2, T=8, form="ext", v="cont", n_ctx=4104),
    "v-pos-generic-d80-gqa": dict(hd=80, n_kv=555, nh=8, nkv=2, T=1, v="pos"),
    "v-cont-generic-d80-bf16-mqa": dict(hd=80, n_kv=300, nh=4, nkv=1, T=3, dtype="bf16", v="cont"),
    "v-pos-d128-mha": dict(hd=128, n_kv=200, nh=4, nkv=4, T=1, v="pos", n_ctx=208),
    "v-cont-d64-gqa4-bf16": dict(hd=64, n_kv=190, nh=8, nkv=2, T=1, dtype="bf16", v="cont"),
    "v-pos-d128-gqa2-t3-diag": dict(hd=128, n_kv=129, nh=4, nkv=2, T=3, form="diag", v="pos"),
    "v-pos-f32-generic-d64": dict(hd=64, n_kv=100, nh=4, nkv=4, T=1, dtype="f32", v="pos", n_ctx=101),
    "one-position": dict(hd=32, n_kv=1, nh=2, nkv=1, T=1),
    "gqa8-d128-fast": dict(hd=128, n_kv=300, nh=16, nkv=2, T=1, n_ctx=304),
    "gqa2-bf16-d64-fast": dict(hd=64, n_kv=200, nh=4, nkv=2, T=3, dtype="bf16", n_ctx=256),
    "mha-diag-d64-fast": dict(hd=64, n_kv=130, nh=3, nkv=3, T=2, form="diag", n_ctx=136),
    "ext-f16-mask-fast": dict(hd=128, n_kv=65, nh=2, nkv=2, T=1, form="ext", n_ctx=72),
    "t8-gqa8-short": dict(hd=128, n_kv=500, nh=16, nkv=2, T=8, n_ctx=504),          # 8 tokens, 8 chunks
    "v-pos-d128-gqa8-short": dict(hd=128, n_kv=300, nh=32, nkv=4, T=1, v="pos", n_ctx=304),
}

# short contexts: the fast builds with attention.SHORT_CHUNK positions a block (the rule picks them)
SHORT = {
    "llama3-8b-tg128-vpos": dict(hd=128, n_kv=128, nh=32, nkv=8, T=1, n_ctx=128, v="pos"),
    "smollm2-h1-d64": dict(hd=64, n_kv=100, nh=9, nkv=3, T=1, n_ctx=128),
    "gqa2-bf16-t3-diag": dict(hd=64, n_kv=200, nh=4, nkv=2, T=3, dtype="bf16", form="diag", n_ctx=256),
    "mha-ext-odd": dict(hd=128, n_kv=65, nh=2, nkv=2, T=1, form="ext", n_ctx=72),
    "gqa4-cont-one-position": dict(hd=64, n_kv=1, nh=8, nkv=2, T=1, v="cont", n_ctx=8),
}


def compute(case, fuse=True):
    ctx = gg.Context()
    out = case.build(ctx)
    g = gg.build_forward(out, backends=("cuda", "cpu"), fuse=fuse)
    g.compute()
    return g, out


@cuda
@pytest.mark.parametrize("combine", ["cluster", "in_kernel", "separate"])
@pytest.mark.parametrize("name", list(CASES))
def test_flash_matches_reference_and_unfused(name, combine, monkeypatch):
    """Every way of combining the chunks: a cluster's shared memory (short contexts, sm_90), the
    last block of a head group (attention.CLUSTER_MAX = 0) or the flash_combine launch
    (attention.FUSE_SPLITS = 0)."""
    from gg.backends.cuda.families import attention
    if combine != "cluster":
        monkeypatch.setattr(attention, "CLUSTER_MAX", 0)
    if combine == "separate":
        monkeypatch.setattr(attention, "FUSE_SPLITS", 0)
    case = Case(**CASES[name], seed=len(name))
    g, out = compute(case)
    (flash,) = flash_steps(g.plan)
    splits = -(-case.n_kv // (flash.choice.chunk or attention.FAST_CHUNK))
    assert flash.choice.fused == (flash.choice.fast and splits <= attention.FUSE_SPLITS)
    assert flash.choice.cluster == (splits if flash.choice.fused and splits <= attention.CLUSTER_MAX else 0)
    assert all(s.backend == "cuda" for s in g.plan.steps)
    assert flash.choice.v_pos == (case.v_form != "t")
    if case.v_form == "cont":
        assert len(flash.elided) == 1 and not [s for s in g.plan.steps if s.ops == ("cont",)], str(g.plan)
    got = out.numpy().reshape(case.nh, case.T, case.hd)
    assert np.isfinite(got).all()
    assert nmse(got, case.reference()) <= LIMIT
    _, plain = compute(case, fuse=False)
    assert nmse(got, plain.numpy().reshape(got.shape)) <= LIMIT


@cuda
@pytest.mark.parametrize("combine", ["cluster", "in_kernel"])
@pytest.mark.parametrize("name", list(SHORT))
def test_short_chunk_matches_reference_and_the_default_chunk(name, combine, monkeypatch):
    """The *_c<SHORT_CHUNK> builds against float64 and against FAST_CHUNK positions a block."""
    if combine != "cluster":
        monkeypatch.setattr(attention, "CLUSTER_MAX", 0)
    case = Case(**SHORT[name], seed=len(name))
    g, out = compute(case)
    (flash,) = flash_steps(g.plan)
    assert flash.choice.chunk == attention.SHORT_CHUNK and flash.kernel.endswith(f"_c{attention.SHORT_CHUNK}")
    got = out.numpy().reshape(case.nh, case.T, case.hd)
    assert np.isfinite(got).all()
    assert nmse(got, case.reference()) <= LIMIT
    monkeypatch.setattr(attention, "SHORT_CHUNK", 0)
    g2, out2 = compute(case)
    assert flash_steps(g2.plan)[0].choice.chunk == attention.FAST_CHUNK
    assert nmse(got, out2.numpy().reshape(got.shape)) <= LIMIT


@cuda
@pytest.mark.parametrize("write", ["cpy", "set_rows"])
@pytest.mark.parametrize("v", ["pos", "cont"])
def test_llama_cpp_block_matches_reference_and_unfused(write, v):
    blk = Block(write=write, v=v, nh=8, nkv=1, T=2, n_past=333)
    g, out = blk.graph()
    assert len(flash_steps(g.plan)) == 1, str(g.plan)
    g.compute()
    got = out.numpy().reshape(blk.nh, blk.T, blk.hd)
    assert nmse(got, blk.reference()) <= LIMIT
    g2, out2 = Block(write=write, v=v, nh=8, nkv=1, T=2, n_past=333).graph(fuse=False)
    g2.compute()
    assert nmse(got, out2.numpy().reshape(got.shape)) <= LIMIT


@cuda
@pytest.mark.parametrize("n_kv", [2000, 600, 300])
def test_flash_replays_with_new_inputs(n_kv):
    """Every replay of the captured graph combines anew (600 positions: the in-kernel combine,
    whose counters the last block of each group resets; 300: the cluster's)."""
    case = Case(64, n_kv, 8, 2, 1, seed=3, n_ctx=-(-(n_kv + 1) // 8) * 8 if n_kv < 2000 else None)  # aligned rows: fast
    g, out = compute(case)
    assert flash_steps(g.plan)[0].choice.fused == (n_kv < 2000)
    assert flash_steps(g.plan)[0].choice.cluster == (5 if n_kv == 300 else 0)
    rng = np.random.default_rng(7)
    for _ in range(4):
        q = rng.standard_normal(case.q.shape)
        case.q_leaf.set(q.astype(np.float32))
        g.compute()
        assert nmse(out.numpy().reshape(case.nh, 1, case.hd), case.reference(q)) <= LIMIT


@cuda
@pytest.mark.parametrize("nkv", [4, 2], ids=["mha", "gqa2-tensor-cores"])
@pytest.mark.parametrize("v", ["t", "pos"])
@pytest.mark.parametrize("n_ctx", [1503, 1504, 504], ids=["generic", "fast", "cluster"])
def test_flash_masked_rows_and_skipped_chunks(n_ctx, v, nkv):
    """A fully masked row gives zeros (as the unfused softmax); chunks that are wholly masked
    never reach the output (not read, or with a cluster's early tiles read and unused), so NaN
    stored there does not either; NaN at a visible position does (in the heads of that K/V head
    only)."""
    n_kv = min(1500, n_ctx - 4)
    case = Case(64, n_kv, 4, nkv, 2, seed=5, n_ctx=n_ctx, v=v)
    seen = n_kv * 2 // 5
    case.mask[0, :] = -np.inf            # token 0 sees nothing
    case.mask[1, seen:] = -np.inf        # token 1 sees only the first positions
    ref = case.reference()
    case.k[seen + 200:seen + 500] = np.nan  # ... and whole chunks past them hold NaN
    case.v[:, :, seen + 200:seen + 500] = np.nan
    g, out = compute(case)
    got = out.numpy().reshape(case.nh, 2, case.hd)
    assert (got[:, 0, :] == 0).all()
    assert nmse(got[:, 1, :], ref[:, 1, :]) <= LIMIT
    case.k[10, 0, 3] = np.nan           # a visible position of kv head 0
    g, out = compute(case)
    got = out.numpy().reshape(case.nh, 2, case.hd)
    r = case.nh // nkv                  # the query heads of kv head 0
    assert np.isnan(got[:r, 1]).all() and np.isfinite(got[r:, 1]).all()


@cuda
@pytest.mark.parametrize("v", ["t", "pos"])
@pytest.mark.parametrize("q_scale", [1e5, 30.0, 1e-3])
def test_flash_q_of_any_magnitude(q_scale, v):
    """The F16 fast builds of 64 positions and 2+ heads a block (here 4) multiply q on tensor cores
    as f16 pairs, scaled per head by a power of two first: q far past f16's range (1e5: unscaled, inf) or small enough that its rounding
    residue would be subnormal stays as accurate as float (heads of each magnitude in one block)."""
    case = Case(128, 700, 8, 2, 1, seed=11, n_ctx=704, v=v, q_scale=q_scale)
    case.q[:, ::2, :] *= 1e-3  # every other head a thousand times smaller
    g, out = compute(case)
    (flash,) = flash_steps(g.plan)
    assert flash.choice.fast and flash.kernel.startswith("flash_attn_f16")
    got = out.numpy().reshape(case.nh, case.T, case.hd)
    assert np.isfinite(got).all()
    assert nmse(got, case.reference()) <= LIMIT
