"""gg.llama: a llama-style transformer block built from gg ops, with an F16 KV cache.

The block is written the way ggml's llama graph is, so the planner sees the same patterns:

    x ─ rms_norm*attn_norm ─ Wq,Wk,Wv ─ rope(q,k) ─ K,V into the cache ─ softmax(scale(K·q) + mask) ─ ·V
      ─ Wo ─ + x ─ rms_norm*ffn_norm ─ down(silu(gate) * up) ─ + ─> out

Two kinds of graph share one `KVCache`:

- **fixed** graphs (`Batch.fixed`): T tokens at a known `n_past`; K and V are written with
  `gg.cpy(f32, view_of_cache)` (kernel `cpy_f32_f16`) and the attention reads the `n_past + T` valid
  rows. The causal mask is an input tensor (or `diag_mask_inf(n_past)`). Used for prefill.
- **indexed** graphs (`Batch.indexed`): positions, the rows to write (`gg.set_rows` with I32
  indices) and the mask are *inputs*, and the attention always reads all `n_ctx` rows with -inf on
  the rows not valid yet. One such graph serves every decode step: only its inputs change.

Cache layout (per layer, as ggml's classic llama): K ne = (head_dim, n_head_kv, n_ctx), one row of
`n_head_kv * head_dim` values per position; V is stored transposed, ne = (n_ctx, head_dim,
n_head_kv), so that `mul_mat(V, softmax)` reads contiguous rows of positions.

`Session` drives it: `prefill(x)` then `decode(x)` repeatedly, building each graph once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from . import ops
from .context import Context
from .dtypes import BF16, F16, F32, I32, DType
from .errors import DTypeError, GGError, ShapeError
from .graph import Graph
from .ops import ROPE_NEOX, ROPE_NORMAL
from .tensor import Tensor

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Config", "LayerWeights", "Weights", "KVCache", "Batch", "attention_block", "transformer_block",
           "build_forward_pass", "Session", "weight_shapes"]


# ---- configuration --------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Model hyper-parameters. `n_head_kv < n_head` is grouped-query attention (GQA): query head h
    uses K/V head `h // (n_head // n_head_kv)`. `n_head_kv=None` means `n_head` (plain MHA)."""

    n_embd: int = 256
    n_head: int = 8
    # The constructor takes None (the default) for n_head; __post_init__ resolves it, so every
    # Config holds an int here.
    n_head_kv: int = None  # type: ignore[assignment]
    n_ff: int = 512
    n_ctx: int = 128
    n_layer: int = 1
    rope_mode: int = ROPE_NORMAL
    rope_base: float = 10000.0
    rope_scale: float = 1.0
    eps: float = 1e-5
    wtype: DType = F16
    kv_type: DType = F16

    def __post_init__(self) -> None:
        if self.n_head_kv is None:
            object.__setattr__(self, "n_head_kv", self.n_head)
        for name in ("n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx", "n_layer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShapeError(f"llama.Config: {name} must be an integer >= 1, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.n_embd % self.n_head:
            raise ShapeError(f"llama.Config: n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ShapeError(f"llama.Config: n_head={self.n_head} must be a multiple of "
                             f"n_head_kv={self.n_head_kv} (GQA)")
        if self.head_dim % 2:
            raise ShapeError(f"llama.Config: head_dim = n_embd / n_head = {self.head_dim} must be even for RoPE")
        if self.rope_mode not in (ROPE_NORMAL, ROPE_NEOX):
            raise ShapeError(f"llama.Config: rope_mode must be gg.ROPE_NORMAL or gg.ROPE_NEOX, got {self.rope_mode!r}")
        for name in ("rope_base", "rope_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ShapeError(f"llama.Config: {name} must be a finite number > 0, got {v!r}")
        if not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) or self.eps < 0:
            raise ShapeError(f"llama.Config: eps must be a finite number >= 0, got {self.eps!r}")
        for name in ("wtype", "kv_type"):
            if getattr(self, name) not in (F32, F16, BF16):
                raise DTypeError(f"llama.Config: {name} must be gg.F32, gg.F16 or gg.BF16, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        """Width of one position's K (or V) row: n_head_kv * head_dim."""
        return self.head_dim * self.n_head_kv


# ---- weights --------------------------------------------------------------------------------
# numpy shapes in PyTorch `Linear.weight` layout (out_features, in_features) = ggml ne (in, out).
def weight_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The numpy shape of every per-layer weight (norm weights are vectors)."""
    e, g, f = cfg.n_embd, cfg.n_embd_gqa, cfg.n_ff
    return {"attn_norm": (e,), "wq": (e, e), "wk": (g, e), "wv": (g, e), "wo": (e, e),
            "ffn_norm": (e,), "w_gate": (f, e), "w_up": (f, e), "w_down": (e, f)}


NORMS = ("attn_norm", "ffn_norm")  # kept in F32, as ggml does


@dataclass
class LayerWeights:
    """One layer's weight tensors. Matrices have ggml ne (in, out). `wq`, `wk` and `wv` are views
    of one leaf `wqkv` (their rows stacked), so the block computes Q, K and V with one mul_mat: one
    pass over the activations and one kernel where three would each pay a launch and a tail."""

    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor
    wqkv: Tensor | None = None


class Weights:
    """All layers' weights, living in one context. Build with `Weights.random` or `Weights.from_numpy`."""

    def __init__(self, cfg: Config, ctx: Context, layers: Sequence[LayerWeights]):
        self.cfg, self.ctx, self.layers = cfg, ctx, list(layers)

    @classmethod
    def from_numpy(cls, cfg: Config, ctx: Context | None,
                   arrays: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]) -> "Weights":
        """Weights from numpy arrays in PyTorch layout: `wq` is (out, in) = (n_embd, n_embd), etc.
        (see `weight_shapes`). `arrays` is one dict per layer, or a single dict when n_layer == 1.
        Matrices are stored as `cfg.wtype`, norm weights as F32."""
        ctx = ctx if ctx is not None else Context()
        if isinstance(arrays, Mapping):
            arrays = [arrays]
        if len(arrays) != cfg.n_layer:
            raise ShapeError(f"llama.Weights: got weights for {len(arrays)} layers, config has n_layer={cfg.n_layer}")
        shapes = weight_shapes(cfg)
        layers = []
        for il, layer in enumerate(arrays):
            missing = [k for k in shapes if k not in layer]
            extra = [k for k in layer if k not in shapes]
            if missing or extra:
                raise ShapeError(f"llama.Weights: layer {il}: missing {missing}, unknown {extra} "
                                 f"(expected {list(shapes)})")
            tensors = {}
            for name, shape in shapes.items():
                a = np.asarray(layer[name])
                if a.shape != shape:
                    raise ShapeError(f"llama.Weights: layer {il} weight '{name}' must have numpy shape {shape} "
                                     f"(PyTorch Linear layout (out, in)), got {a.shape}")
                if name in ("wq", "wk", "wv"):
                    continue  # stored stacked, below
                dtype = F32 if name in NORMS else cfg.wtype
                tensors[name] = ctx.tensor(a, name=f"blk{il}.{name}", dtype=dtype)
            wqkv = ctx.tensor(np.concatenate([np.asarray(layer[k]) for k in ("wq", "wk", "wv")]),
                              name=f"blk{il}.wqkv", dtype=cfg.wtype)
            e, g = cfg.n_embd, cfg.n_embd_gqa
            row = wqkv.nb[1]
            tensors["wq"] = ops.view_2d(wqkv, e, e, row, 0)
            tensors["wk"] = ops.view_2d(wqkv, e, g, row, e * row)
            tensors["wv"] = ops.view_2d(wqkv, e, g, row, (e + g) * row)
            layers.append(LayerWeights(**tensors, wqkv=wqkv))
        return cls(cfg, ctx, layers)

    @classmethod
    def random(cls, cfg: Config, ctx: Context | None = None, seed: int = 0) -> "Weights":
        """Seeded random weights scaled so activations stay O(1): matrices N(0, 1/in_features),
        norm weights 1 + N(0, 0.1^2)."""
        rng = np.random.default_rng(seed)
        arrays = []
        for _ in range(cfg.n_layer):
            layer = {}
            for name, shape in weight_shapes(cfg).items():
                if name in NORMS:
                    layer[name] = 1.0 + 0.1 * rng.standard_normal(shape)
                else:
                    layer[name] = rng.standard_normal(shape) / math.sqrt(shape[1])
            arrays.append({k: v.astype(np.float32) for k, v in layer.items()})
        return cls.from_numpy(cfg, ctx, arrays)

    def numpy(self) -> list[dict[str, np.ndarray]]:
        """The stored values (after rounding to wtype) as float64 arrays in PyTorch layout, per layer."""
        return [{f.name: getattr(lw, f.name).numpy().astype(np.float64) for f in fields(LayerWeights)
                 if f.name != "wqkv"} for lw in self.layers]


def _check_room(cfg: Config, n_past: int, n_tokens: int) -> None:
    if isinstance(n_past, bool) or not isinstance(n_past, (int, np.integer)) or n_past < 0:
        raise ShapeError(f"llama.KVCache: n_past must be an integer >= 0, got {n_past!r}")
    if n_tokens < 1:
        raise ShapeError(f"llama.KVCache: need at least one token, got {n_tokens}")
    if n_past + n_tokens > cfg.n_ctx:
        raise ShapeError(f"llama.KVCache: cannot write {n_tokens} token(s) at n_past={n_past}: the cache "
                         f"holds n_ctx={cfg.n_ctx} positions (would need {n_past + n_tokens})")


# ---- KV cache -------------------------------------------------------------------------------
class KVCache:
    """Persistent K and V tensors of `n_ctx` positions per layer (`cfg.kv_type`, F16 by default).

    K[il] ne = (head_dim, n_head_kv, n_ctx); V[il] ne = (n_ctx, head_dim, n_head_kv) (transposed).
    `n_past` counts the valid positions 0..n_past-1; `Session` advances it after each compute."""

    def __init__(self, cfg: Config, ctx: Context | None = None):
        self.cfg = cfg
        self.ctx = ctx if ctx is not None else Context()
        hd, nkv, n = cfg.head_dim, cfg.n_head_kv, cfg.n_ctx
        self.k = [self.ctx.new_tensor(cfg.kv_type, (hd, nkv, n), name=f"cache_k_l{il}", persistent=True)
                  for il in range(cfg.n_layer)]
        self.v = [self.ctx.new_tensor(cfg.kv_type, (n, hd, nkv), name=f"cache_v_l{il}", persistent=True)
                  for il in range(cfg.n_layer)]
        self.n_past = 0

    def check_room(self, n_past: int, n_tokens: int) -> None:
        """Raise a ShapeError unless positions n_past .. n_past + n_tokens - 1 fit in the cache."""
        _check_room(self.cfg, n_past, n_tokens)

    def keys(self, il: int) -> np.ndarray:
        """Layer il's valid keys, numpy (n_past, n_head_kv, head_dim) in the cache dtype."""
        return self.k[il].numpy().reshape(self.cfg.n_ctx, self.cfg.n_head_kv, self.cfg.head_dim)[:self.n_past]

    def values(self, il: int) -> np.ndarray:
        """Layer il's valid values, numpy (n_past, n_head_kv, head_dim) (un-transposed)."""
        v = self.v[il].numpy().reshape(self.cfg.n_head_kv, self.cfg.head_dim, self.cfg.n_ctx)
        return v.transpose(2, 0, 1)[:self.n_past]

    def clear(self) -> None:
        """Forget every position (rows are overwritten by later writes; masks hide stale ones)."""
        self.n_past = 0


def _set(t: Tensor, a: np.ndarray) -> None:
    # Tensor.set takes ne[::-1] or the n_dims shape; (1, n) for ne (n, 1) is neither, so be explicit.
    t.set(np.asarray(a).reshape(t.ne[::-1]))


# ---- per-graph inputs -----------------------------------------------------------------------
class Batch:
    """The input tensors of one graph over `n_tokens` tokens: positions, the causal mask, and (for
    indexed graphs) the cache rows to write. Create with `Batch.fixed` or `Batch.indexed`."""

    def __init__(self, cfg: Config, ctx: Context, n_tokens: int, n_past: int | None, mask: str):
        if isinstance(n_tokens, bool) or int(n_tokens) != n_tokens or n_tokens < 1:
            raise ShapeError(f"llama.Batch: n_tokens must be an integer >= 1, got {n_tokens!r}")
        if mask not in ("input", "diag"):
            raise GGError(f"llama.Batch: mask must be 'input' or 'diag', got {mask!r}")
        self.cfg, self.n_tokens, self.n_past = cfg, int(n_tokens), n_past
        T = self.n_tokens
        self.pos = ctx.new_tensor(I32, (T,), name="inp_pos")
        self.k_idx: Tensor | None = None  # indexed graphs: the cache rows to write
        self.v_idx: Tensor | None = None
        if n_past is None:  # indexed: everything that depends on the position is an input
            self.n_kv = cfg.n_ctx
            self.k_idx = self.pos  # token t's K row is its position: one upload less a step
            self.v_idx = ctx.new_tensor(I32, (T * cfg.n_embd_gqa,), name="inp_v_idx")
        else:
            self.n_kv = n_past + T
        self.mask = ctx.new_tensor(F32, (self.n_kv, T), name="inp_mask") if mask == "input" else None
        # bind()'s constant index arrays, made on first use
        self._cols: np.ndarray | None = None
        self._v_base: np.ndarray | None = None

    @classmethod
    def fixed(cls, cfg: Config, ctx: Context, n_tokens: int, n_past: int, mask: str = "input") -> "Batch":
        """Inputs for T tokens at positions n_past..n_past+T-1, fixed when the graph is built.
        mask="input": an F32 (n_past+T, T) mask tensor; mask="diag": `diag_mask_inf(n_past)`."""
        _check_room(cfg, n_past, n_tokens)
        b = cls(cfg, ctx, n_tokens, int(n_past), mask)
        b.bind(int(n_past))
        return b

    @classmethod
    def indexed(cls, cfg: Config, ctx: Context, n_tokens: int = 1) -> "Batch":
        """Inputs for a reusable graph: call `bind(n_past)` before each compute."""
        return cls(cfg, ctx, n_tokens, None, "input")

    @property
    def is_indexed(self) -> bool:
        return self.n_past is None

    def bind(self, n_past: int) -> None:
        """Set the inputs for tokens at positions n_past..n_past+T-1."""
        _check_room(self.cfg, n_past, self.n_tokens)
        if not self.is_indexed and n_past != self.n_past:
            raise ShapeError(f"llama.Batch: this graph was built for n_past={self.n_past}, got {n_past}")
        T, n_ctx, E = self.n_tokens, self.cfg.n_ctx, self.cfg.n_embd_gqa
        rows = n_past + np.arange(T, dtype=np.int32)
        _set(self.pos, rows)
        if self.mask is not None:
            # token t (at position n_past + t) sees cache rows 0..n_past + t; later or unwritten rows: -inf
            if self._cols is None:
                self._cols = np.arange(self.n_kv, dtype=np.int32)
            _set(self.mask, np.where(self._cols[None, :] <= rows[:, None], np.float32(0), np.float32(-np.inf)))
        if self.is_indexed:  # k_idx is pos, set above
            assert self.v_idx is not None  # made for indexed batches
            # V is transposed: value e of token t lives at element e * n_ctx + row_t of the cache.
            if self._v_base is None:
                self._v_base = np.arange(E, dtype=np.int32) * np.int32(n_ctx)
            _set(self.v_idx, (self._v_base[None, :] + rows[:, None]).reshape(-1))


# ---- graph builders -------------------------------------------------------------------------
def _check_x(what: str, cfg: Config, x: Tensor, batch: Batch) -> None:
    if not isinstance(x, Tensor):
        raise DTypeError(f"llama.{what}: x must be a gg.Tensor, got {type(x).__name__}")
    if x.dtype is not F32:
        raise DTypeError(f"llama.{what}: x must be F32, got {x.dtype.name}")
    if x.ne != (cfg.n_embd, batch.n_tokens, 1, 1):
        raise ShapeError(f"llama.{what}: x ne={x.ne} must be (n_embd={cfg.n_embd}, n_tokens={batch.n_tokens}, 1, 1)")


def _write_kv(gf: Graph, cfg: Config, cache: KVCache, il: int, k: Tensor, v: Tensor,
              batch: Batch) -> tuple[Tensor, Tensor]:
    """Write this batch's K (hd, n_head_kv, T) and V (n_embd_gqa, T) into layer il's cache and
    return views of the cache for the attention to read: K (hd, n_kv, n_head_kv) and V (n_kv, hd,
    n_head_kv). The writes are expanded into `gf` first, so they run before every read (DESIGN §1)."""
    K, V = cache.k[il], cache.v[il]
    hd, nkv, T, n_kv = cfg.head_dim, cfg.n_head_kv, batch.n_tokens, batch.n_kv
    if batch.is_indexed:
        assert batch.k_idx is not None and batch.v_idx is not None  # made for indexed batches
        # set_rows takes reshaped k and v (views of the rope and of the qkv product): contiguous
        # for one token already, copied otherwise.
        v = v if v.is_contiguous() else ops.cont(v)
        k = k if k.is_contiguous() else ops.cont(k)
        # Rows chosen at run time by I32 inputs. V rows are single elements (V is transposed).
        k_dst = ops.set_rows(ops.reshape(K, cfg.n_embd_gqa, cfg.n_ctx), ops.reshape(k, cfg.n_embd_gqa, T), batch.k_idx)
        v_dst = ops.set_rows(ops.reshape(V, 1, cfg.n_ctx * cfg.n_embd_gqa), ops.reshape(v, 1, cfg.n_embd_gqa * T),
                             batch.v_idx)
        k_base, v_base = k_dst, v_dst  # reading through the writes adds the edge as well
    else:
        n_past = batch.n_past
        assert n_past is not None  # a fixed batch
        k_view = ops.view_3d(K, hd, nkv, T, K.nb[1], K.nb[2], n_past * K.nb[2])
        v_view = ops.view_3d(V, T, hd, nkv, V.nb[1], V.nb[2], n_past * V.nb[0])
        k_dst = ops.cpy(k, k_view)
        # (hd, n_head_kv, T) -> (T, hd, n_head_kv): cpy matches elements in logical order. v's
        # rows (tokens) are contiguous, so a 3-d view of it needs no copy (a cont was 8 us of a
        # T=512 prefill on the H100); the tiled transposing copy reads the strided rows itself.
        v3 = ops.view_3d(v, hd, nkv, T, hd * v.nb[0], v.nb[1], 0)
        v_dst = ops.cpy(ops.permute(v3, 1, 2, 0, 3), v_view)
        k_base, v_base = K, V
    gf.build_forward_expand(k_dst)
    gf.build_forward_expand(v_dst)
    k_read = ops.view_3d(k_base, hd, n_kv, nkv, K.nb[2], K.nb[1], 0)
    v_read = ops.view_3d(v_base, n_kv, hd, nkv, V.nb[1], V.nb[2], 0)
    return k_read, v_read


def attention_block(gf: Graph, cfg: Config, w: LayerWeights, cache: KVCache, il: int, x: Tensor,
                    batch: Batch) -> Tensor:
    """x + Wo · attention(rope(Wq·h), cache K, cache V) with h = rms_norm(x) * attn_norm.

    x is F32 ne (n_embd, T). This batch's K and V go into layer il's cache first (expanded into
    `gf`), then the attention reads the cache's first `batch.n_kv` rows, masked causally. GQA comes
    from mul_mat broadcasting the cache's n_head_kv heads over the n_head query heads."""
    _check_x("attention_block", cfg, x, batch)
    if not 0 <= il < cfg.n_layer:
        raise ShapeError(f"llama.attention_block: layer {il} out of range for n_layer={cfg.n_layer}")
    T, hd, nh, nkv = batch.n_tokens, cfg.head_dim, cfg.n_head, cfg.n_head_kv
    cur = ops.mul(ops.rms_norm(x, cfg.eps), w.attn_norm)        # fuses: rms_norm+mul

    def rope(t: Tensor) -> Tensor:
        return ops.rope(t, batch.pos, hd, mode=cfg.rope_mode, freq_base=cfg.rope_base, freq_scale=cfg.rope_scale)

    if w.wqkv is not None:  # one product, then views: rows [q | k | v] of every token's column
        qkv = ops.mul_mat(w.wqkv, cur)                            # (n_embd + 2 n_embd_gqa, T)
        f, col = qkv.dtype.size, qkv.nb[1]
        # q and k heads are adjacent rows: one rope over both, then views of its result
        qk = rope(ops.view_3d(qkv, hd, nh + nkv, T, hd * f, col, 0))
        q = ops.view_3d(qk, hd, nh, T, qk.nb[1], qk.nb[2], 0)
        k = ops.view_3d(qk, hd, nkv, T, qk.nb[1], qk.nb[2], nh * qk.nb[1])
        v = ops.view_2d(qkv, cfg.n_embd_gqa, T, col, (cfg.n_embd + cfg.n_embd_gqa) * f)
    else:  # separately built LayerWeights without the stacked leaf
        q = rope(ops.reshape(ops.mul_mat(w.wq, cur), hd, nh, T))
        k = rope(ops.reshape(ops.mul_mat(w.wk, cur), hd, nkv, T))
        v = ops.mul_mat(w.wv, cur)                                # (n_embd_gqa, T)
    k_cache, v_cache = _write_kv(gf, cfg, cache, il, k, v, batch)

    kq = ops.mul_mat(k_cache, ops.permute(q, 0, 2, 1, 3))         # (n_kv, T, n_head)
    kq = ops.scale(kq, 1.0 / math.sqrt(hd))
    if batch.mask is not None:
        kq = ops.add(kq, batch.mask)
    else:  # mask="diag": only fixed batches have one, so n_past is known
        assert batch.n_past is not None
        kq = ops.diag_mask_inf(kq, batch.n_past)
    kq = ops.soft_max(kq)                                         # fuses: scale+add|diag_mask_inf+soft_max
    kqv = ops.mul_mat(v_cache, kq)                                # (hd, T, n_head)
    cur = ops.permute(kqv, 0, 2, 1, 3)                            # (hd, n_head, T)
    cur = ops.reshape(cur if cur.is_contiguous() else ops.cont(cur), cfg.n_embd, T)  # T == 1: no copy
    return ops.add(ops.mul_mat(w.wo, cur), x)


def transformer_block(gf: Graph, cfg: Config, w: LayerWeights, cache: KVCache, il: int, x: Tensor,
                      batch: Batch) -> Tensor:
    """attention_block, then h + W_down · (silu(W_gate·g) * W_up·g) with g = rms_norm(h) * ffn_norm."""
    h = attention_block(gf, cfg, w, cache, il, x, batch)
    cur = ops.mul(ops.rms_norm(h, cfg.eps), w.ffn_norm)
    cur = ops.mul(ops.silu(ops.mul_mat(w.w_gate, cur)), ops.mul_mat(w.w_up, cur))
    return ops.add(ops.mul_mat(w.w_down, cur), h)


def build_forward_pass(cfg: Config, weights: Weights, cache: KVCache, batch: Batch,
                       backends: Sequence[str] | None = None, fuse: bool = True) -> tuple[Graph, Tensor, Tensor]:
    """A graph running all layers on a new F32 input x (n_embd, T). Returns (graph, x, out)."""
    if cache.cfg != cfg or weights.cfg != cfg:
        raise GGError("llama.build_forward_pass: weights, cache and the config do not match")
    gf = Graph(backends=backends, fuse=fuse)
    x = weights.ctx.new_tensor(F32, (cfg.n_embd, batch.n_tokens), name="inp_x")
    cur = x
    for il, lw in enumerate(weights.layers):
        cur = transformer_block(gf, cfg, lw, cache, il, cur, batch)
    cur.name = "out"
    gf.build_forward_expand(cur)
    return gf, x, cur


# ---- driver ---------------------------------------------------------------------------------
@dataclass
class _Entry:
    graph: Graph
    x: Tensor
    out: Tensor
    batch: Batch


class Session:
    """Runs the model over a growing sequence: `prefill(x)` (T tokens) and `decode(x)` (1 token),
    each at the cache's current `n_past`, returning numpy results.

    Graphs are built once and reused: a fixed graph per (T, n_past) for prefill, and for decode one
    indexed graph (`reuse_decode=True`, default) whose inputs are re-bound every step, or a fixed
    graph per position (`reuse_decode=False`, ggml's classic way). `mask="diag"` uses
    `diag_mask_inf` instead of a mask input in fixed graphs."""

    def __init__(self, cfg: Config, weights: Weights, cache: KVCache | None = None,
                 backends: Sequence[str] | None = None, reuse_decode: bool = True, mask: str = "input",
                 fuse: bool = True):
        if mask not in ("input", "diag"):
            raise GGError(f"llama.Session: mask must be 'input' or 'diag', got {mask!r}")
        self.cfg, self.weights = cfg, weights
        self.cache = cache if cache is not None else KVCache(cfg, weights.ctx)
        self.backends, self.reuse_decode, self.mask, self.fuse = backends, reuse_decode, mask, fuse
        self.fixed: dict[tuple[int, int], _Entry] = {}
        self.decoder: _Entry | None = None
        self.last: _Entry | None = None

    @property
    def n_past(self) -> int:
        return self.cache.n_past

    def _as_tokens(self, what: str, x: npt.ArrayLike, one: bool) -> np.ndarray:
        x = np.asarray(x)
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise DTypeError(f"llama.Session.{what}: x must be numeric, got {x.dtype}")
        if one and x.shape == (self.cfg.n_embd,):
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.cfg.n_embd or x.shape[0] < 1 or (one and x.shape[0] != 1):
            want = f"(n_embd,) or (1, n_embd) = (1, {self.cfg.n_embd})" if one else f"(T, n_embd={self.cfg.n_embd})"
            raise ShapeError(f"llama.Session.{what}: x must have shape {want}, got {x.shape}")
        return x.astype(np.float32)

    def _fixed(self, T: int, n_past: int) -> _Entry:
        key = (T, n_past)
        if key not in self.fixed:
            batch = Batch.fixed(self.cfg, self.weights.ctx, T, n_past, self.mask)
            self.fixed[key] = _Entry(*build_forward_pass(self.cfg, self.weights, self.cache, batch,
                                                         self.backends, self.fuse), batch)
        return self.fixed[key]

    def _run(self, entry: _Entry, x: np.ndarray) -> np.ndarray:
        T, n_past = x.shape[0], self.cache.n_past
        entry.batch.bind(n_past)
        _set(entry.x, x)
        entry.graph.compute()
        self.cache.n_past = n_past + T
        self.last = entry
        return entry.out.numpy().reshape(T, self.cfg.n_embd)

    def prefill(self, x: npt.ArrayLike) -> np.ndarray:
        """Run T tokens x (T, n_embd) at positions n_past..n_past+T-1; returns (T, n_embd)."""
        x = self._as_tokens("prefill", x, one=False)
        self.cache.check_room(self.cache.n_past, x.shape[0])
        return self._run(self._fixed(x.shape[0], self.cache.n_past), x)

    def decode(self, x: npt.ArrayLike) -> np.ndarray:
        """Run one token x (n_embd,) at position n_past; returns (n_embd,)."""
        x = self._as_tokens("decode", x, one=True)
        self.cache.check_room(self.cache.n_past, 1)
        if not self.reuse_decode:
            return self._run(self._fixed(1, self.cache.n_past), x)[0]
        if self.decoder is None:
            batch = Batch.indexed(self.cfg, self.weights.ctx, 1)
            self.decoder = _Entry(*build_forward_pass(self.cfg, self.weights, self.cache, batch,
                                                      self.backends, self.fuse), batch)
        return self._run(self.decoder, x)[0]

    def reset(self) -> None:
        """Start a new sequence (graphs are kept)."""
        self.cache.clear()
