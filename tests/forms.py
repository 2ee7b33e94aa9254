"""The llama decode block written in many equivalent forms through gg's public API (issue 20).

A user who ports a model writes the attention block the way llama.cpp (or their own habit) does,
not the way gg.llama shapes it; the planner must give every such form the fast plan. This module
builds one decode step (one token at a given n_past) of

    out = x + Wo · attn(rope(Wq·h), rope(Wk·h), V),  h = rms_norm(x) * attn_norm
    (full layer: then  out2 = out + Wdown · (silu(Wgate·g) * Wup·g),  g = rms_norm(out) * ffn_norm)

in each form of `FORMS`, plus a float64 numpy reference generic over the forms' options. Used by
tests/test_forms.py (correctness, fused == unfused) and bench/bench_forms.py (timings).

Caches: the user forms store K and V alike, position-major per head: ne (head_dim, n_ctx, n_head_kv)
(llama.cpp's V layout with flash attention); gg.llama's forms use its own KVCache (V transposed).
Both are filled from the same rows (n_ctx, n_head_kv, head_dim) so every form computes the same
values. Weights come as float32 numpy arrays in PyTorch layout (out, in), see `make_arrays`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
import numpy as np

import gg
from gg import llama as L
from llama_ref import rms, rope_ref

# ---- configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dims:
    """The block's sizes. head_dim = n_embd / n_head."""

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        return self.head_dim * self.n_head_kv


@dataclass(frozen=True)
class Form:
    """One way of writing the block. `builder` "llama" is gg.llama's own builder (its stacked wqkv,
    transposed V cache and reusable indexed decode graph); "user" is the hand-written graph whose
    options the other fields pick."""

    name: str
    doc: str
    builder: str = "user"                 # "user" | "llama"
    rope_mode: int = gg.ROPE_NEOX
    v_read: str = "transpose"             # "transpose": mul_mat(transpose(V view), kq); "cont": cont(...) first
    softmax: str = "ext"                  # "ext": soft_max_ext(kq, mask, scale); "diag": scale, diag_mask_inf, soft_max
    mask_dtype: gg.DType = gg.F32         # of the mask input ("ext")
    residual: str = "x+mm"                # "x+mm": add(x, Wo·a); "mm+x": add(Wo·a, x)
    kv_write: str = "cpy"                 # "cpy": cpy into a view at n_past; "set_rows": I32 row index input
    kv_heads: str = "dims"                # "dims": as given; "gqa": n_head / 4; "mqa": 1
    wtype: gg.DType | None = None         # None: the caller's weight dtype (F16); else e.g. gg.Q8_0
    ffn: bool = False                     # the full layer (attention + SwiGLU FFN)

    def dims(self, base: Dims) -> Dims:
        """The sizes this form runs at, from the caller's base sizes."""
        if self.kv_heads == "gqa":
            return replace(base, n_head_kv=max(1, base.n_head // 4))
        if self.kv_heads == "mqa":
            return replace(base, n_head_kv=1)
        return base


FORMS: dict[str, Form] = {f.name: f for f in (
    Form("gg.llama", "a: gg.llama.attention_block (stacked wqkv, V transposed, indexed graph, rope NORMAL)",
         builder="llama", rope_mode=gg.ROPE_NORMAL),
    Form("gg.llama-neox", "a': gg.llama.attention_block with rope NEOX", builder="llama"),
    Form("llama.cpp", "b: separate Wq/Wk/Wv, rope NEOX, cpy into K/V views (V like K), transpose(V), "
         "soft_max_ext(mask input)"),
    Form("v-cont", "c: b with V read through cont(transpose(V))", v_read="cont"),
    Form("mask-f16", "b with the mask input stored F16 (llama.cpp's flash-attention mask)", mask_dtype=gg.F16),
    Form("diag-mask", "d: b with rope NORMAL and scale -> diag_mask_inf -> soft_max",
         rope_mode=gg.ROPE_NORMAL, softmax="diag"),
    Form("add-mm-x", "e: b with the residual written add(Wo·a, x)", residual="mm+x"),
    Form("set-rows", "f: b with K/V written by set_rows (I32 row input), all n_ctx rows read under the mask",
         kv_write="set_rows"),
    Form("gqa", "g: b with n_head_kv = n_head / 4", kv_heads="gqa"),
    Form("mqa", "h: b with n_head_kv = 1", kv_heads="mqa"),
    Form("q8_0", "i: b with Q8_0 weight matrices", wtype=gg.Q8_0),
    Form("layer:llama.cpp", "j: b's attention + FFN with separate gate/up (silu)", ffn=True),
    Form("layer:gg.llama", "j': gg.llama.transformer_block", builder="llama", rope_mode=gg.ROPE_NORMAL, ffn=True),
    Form("layer:gg.llama-neox", "j'': gg.llama.transformer_block with rope NEOX", builder="llama", ffn=True),
)}
ATTENTION_FORMS = tuple(n for n, f in FORMS.items() if not f.ffn)
LAYER_FORMS = tuple(n for n, f in FORMS.items() if f.ffn)

MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
NORMS = ("attn_norm", "ffn_norm")


def weight_shapes(d: Dims, ffn: bool = True) -> dict[str, tuple[int, ...]]:
    """numpy shapes, PyTorch Linear layout (out, in); norm weights are vectors."""
    e, g, f = d.n_embd, d.n_embd_gqa, d.n_ff
    shapes = {"attn_norm": (e,), "wq": (e, e), "wk": (g, e), "wv": (g, e), "wo": (e, e)}
    if ffn:
        shapes.update({"ffn_norm": (e,), "w_gate": (f, e), "w_up": (f, e), "w_down": (e, f)})
    return shapes


def make_arrays(d: Dims, seed: int = 0, ffn: bool = True) -> dict[str, np.ndarray]:
    """float32 weights: matrices N(0, 1/in) (activations stay O(1)), norm weights 1 + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(d, ffn).items():
        if name in NORMS:
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        else:
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(shape[1]))
    return out


def make_cache_rows(d: Dims, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """K and V rows for all n_ctx positions, float16 (n_ctx, n_head_kv, head_dim)."""
    rng = np.random.default_rng(seed)
    shape = (d.n_ctx, d.n_head_kv, d.head_dim)
    return (rng.standard_normal(shape, dtype=np.float32).astype(np.float16),
            rng.standard_normal(shape, dtype=np.float32).astype(np.float16))


# ---- a built form ---------------------------------------------------------------------------


@dataclass
class Built:
    """One form's decode-step graph. `inputs` are (leaf, value) pairs to set before computing
    (x, positions, mask, row indices, and the caches' prior rows); `set_inputs()` sets them all.
    `weights` are the leaves holding the matrices and norms (for `stored_weights`)."""

    form: Form
    dims: Dims
    n_past: int
    graph: gg.Graph
    out: gg.Tensor
    x: np.ndarray
    inputs: list[tuple[gg.Tensor, np.ndarray]]
    weights: dict[str, gg.Tensor]
    k_rows: np.ndarray
    v_rows: np.ndarray
    ctx: gg.Context
    extra: dict = field(default_factory=dict)

    def set_inputs(self) -> None:
        for t, a in self.inputs:
            t.set(a)

    def result(self) -> np.ndarray:
        return self.out.numpy().reshape(self.dims.n_embd).astype(np.float64)

    def stored_weights(self) -> dict[str, np.ndarray]:
        """The weights as gg stores them (F16-rounded, Q8_0-dequantized), float64, PyTorch layout."""
        return {k: t.numpy().astype(np.float64).reshape(t.ne[1], t.ne[0]) if k not in NORMS
                else t.numpy().astype(np.float64).reshape(-1) for k, t in self.weights.items()}

    def reference(self) -> np.ndarray:
        """The float64 reference of this block from the stored weights and cache rows."""
        return reference(self.dims, self.form.rope_mode, self.stored_weights(), self.k_rows, self.v_rows,
                         self.x, self.n_past, self.form.ffn)

    def free(self) -> None:
        self.ctx.free()


def build(form: Form | str, base: Dims, n_past: int, arrays: dict[str, np.ndarray],
          k_rows: np.ndarray, v_rows: np.ndarray, x: np.ndarray, wtype: gg.DType = gg.F16,
          backends: tuple[str, ...] | None = None, fuse: bool = True) -> Built:
    """Build `form`'s decode step at n_past (0 <= n_past < n_ctx) with its own gg.Context.

    `arrays` (make_arrays), `k_rows`/`v_rows` (make_cache_rows) and x (n_embd,) float32 must be
    for `form.dims(base)`. The returned graph has its inputs set already."""
    f = FORMS[form] if isinstance(form, str) else form
    d = f.dims(base)
    if not 0 <= n_past < d.n_ctx:
        raise ValueError(f"forms.build: n_past {n_past} outside the cache of n_ctx {d.n_ctx}")
    if k_rows.shape != (d.n_ctx, d.n_head_kv, d.head_dim) or x.shape != (d.n_embd,):
        raise ValueError(f"forms.build: cache rows {k_rows.shape} / x {x.shape} do not fit {d}")
    builder = _build_llama if f.builder == "llama" else _build_user
    b = builder(f, d, n_past, arrays, k_rows, v_rows, np.asarray(x, np.float32), f.wtype or wtype, backends, fuse)
    b.set_inputs()
    return b


def _weight_leaves(ctx: gg.Context, arrays: dict[str, np.ndarray], names, wtype: gg.DType) -> dict[str, gg.Tensor]:
    out = {}
    for name in names:
        a = arrays[name]
        if name in NORMS:
            out[name] = ctx.tensor(a, name=name, dtype=gg.F32)
        elif wtype.is_quantized:
            out[name] = ctx.quantize(a, wtype, name=name)
        else:
            out[name] = ctx.tensor(a, name=name, dtype=wtype)
    return out


def _build_user(f: Form, d: Dims, n_past: int, arrays, k_rows, v_rows, x, wtype, backends, fuse) -> Built:
    ctx = gg.Context()
    hd, nh, nkv, n_ctx = d.head_dim, d.n_head, d.n_head_kv, d.n_ctx
    w = _weight_leaves(ctx, arrays, list(weight_shapes(d, f.ffn)), wtype)
    gf = gg.Graph(backends=backends, fuse=fuse)

    xt = ctx.new_tensor(gg.F32, (d.n_embd, 1), name="inp_x")
    pos = ctx.new_tensor(gg.I32, (1,), name="inp_pos")
    # Both caches position-major per head: row (pos, head) is hd contiguous values.
    K = ctx.new_tensor(gg.F16, (hd, n_ctx, nkv), name="cache_k", persistent=True)
    V = ctx.new_tensor(gg.F16, (hd, n_ctx, nkv), name="cache_v", persistent=True)
    inputs: list[tuple[gg.Tensor, np.ndarray]] = [
        (xt, x.reshape(1, -1)), (pos, np.array([n_past], np.int32)),
        (K, np.ascontiguousarray(k_rows.transpose(1, 0, 2))), (V, np.ascontiguousarray(v_rows.transpose(1, 0, 2)))]

    h = gg.mul(gg.rms_norm(xt, d.eps), w["attn_norm"])
    q = gg.reshape(gg.mul_mat(w["wq"], h), hd, nh, 1)
    k = gg.reshape(gg.mul_mat(w["wk"], h), hd, nkv, 1)
    v = gg.reshape(gg.mul_mat(w["wv"], h), hd, nkv, 1)
    q = gg.rope(q, pos, hd, mode=f.rope_mode, freq_base=d.rope_base)
    k = gg.rope(k, pos, hd, mode=f.rope_mode, freq_base=d.rope_base)

    if f.kv_write == "cpy":
        n_kv = n_past + 1
        for src, cache in ((k, K), (v, V)):   # (hd, nkv, 1) into row n_past of every head
            dst = gg.view_3d(cache, hd, nkv, 1, cache.nb[2], cache.nb[1], n_past * cache.nb[1])
            gf.build_forward_expand(gg.cpy(src, dst))
        mask_rows = np.zeros((1, n_kv), np.float32)
    elif f.kv_write == "set_rows":
        # The reusable decode graph: the row to write is an input and every cache row is read,
        # the ones not written yet masked out.
        n_kv = n_ctx
        idx = ctx.new_tensor(gg.I32, (1,), name="inp_kv_idx")
        inputs.append((idx, np.array([n_past], np.int32)))
        for src, cache in ((k, K), (v, V)):   # rows of hd per (position, head): src (hd, 1, nkv)
            gf.build_forward_expand(gg.set_rows(cache, gg.permute(src, 0, 2, 1, 3), idx))
        mask_rows = np.where(np.arange(n_ctx) <= n_past, 0.0, -np.inf).astype(np.float32)[None, :]
    else:
        raise ValueError(f"forms: unknown kv_write {f.kv_write!r}")

    # The writes were expanded first: every read of the caches below comes after them (DESIGN §1).
    kc = gg.view_3d(K, hd, n_kv, nkv, K.nb[1], K.nb[2], 0)            # (hd, n_kv, nkv)
    vc = gg.view_3d(V, hd, n_kv, nkv, V.nb[1], V.nb[2], 0)
    kq = gg.mul_mat(kc, gg.permute(q, 0, 2, 1, 3))                    # (n_kv, 1, nh)
    scale = 1.0 / math.sqrt(hd)
    if f.softmax == "ext":
        mask = ctx.new_tensor(f.mask_dtype, (n_kv, 1), name="inp_mask")
        inputs.append((mask, mask_rows.astype(np.float16) if f.mask_dtype is gg.F16 else mask_rows))
        kq = gg.soft_max_ext(kq, mask, scale)
    elif f.softmax == "diag":
        if f.kv_write != "cpy":
            raise ValueError("forms: diag_mask_inf needs the fixed n_past of a cpy form")
        kq = gg.soft_max(gg.diag_mask_inf(gg.scale(kq, scale), n_past))
    else:
        raise ValueError(f"forms: unknown softmax {f.softmax!r}")
    vt = gg.transpose(vc)                                             # (n_kv, hd, nkv), positions strided
    if f.v_read == "cont":
        vt = gg.cont(vt)
    elif f.v_read != "transpose":
        raise ValueError(f"forms: unknown v_read {f.v_read!r}")
    kqv = gg.mul_mat(vt, kq)                                          # (hd, 1, nh)
    attn = gg.reshape(gg.permute(kqv, 0, 2, 1, 3), d.n_embd, 1)       # one token: already contiguous

    def residual(mm: gg.Tensor, r: gg.Tensor) -> gg.Tensor:
        return gg.add(mm, r) if f.residual == "mm+x" else gg.add(r, mm)

    out = residual(gg.mul_mat(w["wo"], attn), xt)
    if f.ffn:
        g = gg.mul(gg.rms_norm(out, d.eps), w["ffn_norm"])
        act = gg.mul(gg.silu(gg.mul_mat(w["w_gate"], g)), gg.mul_mat(w["w_up"], g))
        out = residual(gg.mul_mat(w["w_down"], act), out)
    out.name = "out"
    gf.build_forward_expand(out)
    return Built(f, d, n_past, gf, out, x, inputs, w, k_rows, v_rows, ctx)


def _build_llama(f: Form, d: Dims, n_past: int, arrays, k_rows, v_rows, x, wtype, backends, fuse) -> Built:
    if wtype not in (gg.F32, gg.F16, gg.BF16):
        raise ValueError(f"forms: gg.llama takes float weights only, not {wtype.name}")
    ctx = gg.Context()
    # gg.llama's Weights want the FFN matrices: tiny zero ones when the form is the attention alone.
    n_ff = d.n_ff if f.ffn else 32
    cfg = L.Config(n_embd=d.n_embd, n_head=d.n_head, n_head_kv=d.n_head_kv, n_ff=n_ff, n_ctx=d.n_ctx,
                   n_layer=1, rope_mode=f.rope_mode, rope_base=d.rope_base, eps=d.eps, wtype=wtype, kv_type=gg.F16)
    full = dict(arrays)
    if not f.ffn:
        for name, shape in L.weight_shapes(cfg).items():
            if name not in weight_shapes(d, False):
                full[name] = np.ones(shape, np.float32) if name in NORMS else np.zeros(shape, np.float32)
    weights = L.Weights.from_numpy(cfg, ctx, {k: full[k] for k in L.weight_shapes(cfg)})
    lw = weights.layers[0]
    cache = L.KVCache(cfg, ctx)
    batch = L.Batch.indexed(cfg, ctx, 1)
    batch.bind(n_past)
    gf = gg.Graph(backends=backends, fuse=fuse)
    xt = ctx.new_tensor(gg.F32, (d.n_embd, 1), name="inp_x")
    block = L.transformer_block if f.ffn else L.attention_block
    out = block(gf, cfg, lw, cache, 0, xt, batch)
    out.name = "out"
    gf.build_forward_expand(out)
    inputs = [(xt, x.reshape(1, -1)), (cache.k[0], k_rows),
              (cache.v[0], np.ascontiguousarray(v_rows.transpose(1, 2, 0)))]
    names = weight_shapes(d, f.ffn)
    w = {n: getattr(lw, n) for n in names}
    return Built(f, d, n_past, gf, out, x, inputs, w, k_rows, v_rows, ctx, extra={"batch": batch, "cache": cache})


# ---- the float64 reference ------------------------------------------------------------------


def reference(d: Dims, rope_mode: int, w: dict[str, np.ndarray], k_rows: np.ndarray, v_rows: np.ndarray,
              x: np.ndarray, n_past: int, ffn: bool) -> np.ndarray:
    """One decode step in float64: w in PyTorch layout (the stored values), k_rows/v_rows
    (n_ctx, n_head_kv, hd) the cache before the step; this token's k and v go into row n_past
    rounded to F16 (the cache dtype), q stays unrounded. Returns (n_embd,)."""
    hd, nh, nkv = d.head_dim, d.n_head, d.n_head_kv
    group = nh // nkv
    x = np.asarray(x, np.float64)[None, :]
    h = rms(x, w["attn_norm"], d.eps)
    pos = np.array([n_past])
    q = rope_ref((h @ w["wq"].T).reshape(1, nh, hd), pos, rope_mode, d.rope_base, 1.0)[0]
    k = rope_ref((h @ w["wk"].T).reshape(1, nkv, hd), pos, rope_mode, d.rope_base, 1.0)[0]
    v = (h @ w["wv"].T).reshape(nkv, hd)
    K = k_rows[:n_past + 1].astype(np.float64)
    V = v_rows[:n_past + 1].astype(np.float64)
    K[n_past] = k.astype(np.float16)
    V[n_past] = v.astype(np.float16)
    attn = np.empty((nh, hd))
    for hq in range(nh):
        s = K[:, hq // group] @ q[hq] / math.sqrt(hd)
        p = np.exp(s - s.max())
        attn[hq] = (p / p.sum()) @ V[:, hq // group]
    out = x + attn.reshape(1, -1) @ w["wo"].T
    if ffn:
        g = rms(out, w["ffn_norm"], d.eps)
        gate, up = g @ w["w_gate"].T, g @ w["w_up"].T
        out = out + (gate / (1.0 + np.exp(-gate)) * up) @ w["w_down"].T
    return out[0]


# ---- plan inspection ------------------------------------------------------------------------


def plan_summary(graph: gg.Graph) -> tuple[int, tuple[str, ...]]:
    """(number of steps, the kernel symbol of each step in order) of graph's plan."""
    steps = graph.plan.steps
    return len(steps), tuple(s.kernel for s in steps)


def bytes_to_read(d: Dims, form: Form, n_past: int, wtype: gg.DType = gg.F16) -> int:
    """What one decode step must read at least: the weight matrices, the norms, the valid K and V
    rows (F16) and x (a form that reads all n_ctx rows under a mask still only needs n_past + 1)."""
    from gg import quant
    dt = form.wtype or wtype
    total = 0
    for name, shape in weight_shapes(d, form.ffn).items():
        total += shape[0] * 4 if name in NORMS else shape[0] * quant.row_bytes(dt, shape[1])
    return total + 2 * (n_past + 1) * d.n_embd_gqa * 2 + d.n_embd * 4

