"""The llama / qwen2 architecture as gg graphs: token ids -> get_rows embedding -> blocks -> final
norm -> output head (all tokens, or the last one only) -> logits, or their argmax.

Blocks are gg.llama's (`transformer_block`, the graph the planner's fusions are tuned on) whenever
the model fits it; qwen2's QKV bias, llama-3 rope frequency factors and partial rotary use
`block` below, the same graph with those pieces added. Q, K and V come from one stacked weight
(`wqkv`), so one product feeds all three, as in gg.llama.

Graphs: a *fixed* graph per (n_tokens, n_past) for prefill chunks, and one *indexed* decode graph
(gg.llama.Batch.indexed) replayed for every generated token with only its inputs changed."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import llama as gl
from .. import ops
from ..backends.base import gathered_writes
from ..context import Context
from ..dtypes import F32, I32
from ..errors import GGError
from ..graph import Graph
from ..ops import ROPE_NEOX
from ..tensor import Tensor
from .hparams import HParams
from .progress import Progress
from .weights import notice_once, stacked_tensor, to_gg_tensor


@dataclass
class ModelWeights:
    tok_embd: Tensor
    output: Tensor          # tok_embd itself when the head is tied
    output_norm: Tensor
    layers: list[gl.LayerWeights]
    qkv_bias: list[Tensor | None]
    tied: bool


def _layer_names(il: int) -> dict[str, str]:
    p = f"blk.{il}."
    return {"attn_norm": p + "attn_norm.weight", "wo": p + "attn_output.weight", "ffn_norm": p + "ffn_norm.weight",
            "w_gate": p + "ffn_gate.weight", "w_up": p + "ffn_up.weight", "w_down": p + "ffn_down.weight"}


def load_weights(src, hp: HParams, ctx: Context, show_progress: bool | None = None) -> ModelWeights:
    """Upload every tensor gg needs from `src` (GGUFFile or HFCheckpoint), one at a time."""
    need = ["token_embd.weight", "output_norm.weight"]
    for il in range(hp.n_layer):
        need += list(_layer_names(il).values())
        need += [f"blk.{il}.attn_{x}.weight" for x in "qkv"]
        if hp.qkv_bias:
            need += [f"blk.{il}.attn_{x}.bias" for x in "qkv"]
    missing = [n for n in need if not src.has(n)]
    if missing:
        raise GGError(f"model: {src.path} lacks tensors {missing[:6]}{' ...' if len(missing) > 6 else ''} "
                      f"needed by the {hp.arch} graph")
    tied = not src.has("output.weight")
    total = sum(src.tensor(n).nbytes for n in need + ([] if tied else ["output.weight"]))
    bar = Progress("loading", total, show_progress)
    done = 0

    def up(name: str) -> Tensor:
        nonlocal done
        st = src.tensor(name)
        t = to_gg_tensor(ctx, name, st.raw, st.ggml_type, st.ne)
        done += st.nbytes
        bar.update(done)
        return t

    def stacked(names: Sequence[str], label: str) -> Tensor:
        # q, k and v rows stacked into one leaf: one product computes all three
        nonlocal done
        parts = []
        for n in names:
            st = src.tensor(n)
            parts.append((n, st.raw, st.ggml_type, tuple(st.ne)))
            done += st.nbytes
        t = stacked_tensor(ctx, label, parts)
        bar.update(done)
        return t

    tok_embd = up("token_embd.weight")
    if tok_embd.ne[:2] != (hp.n_embd, hp.n_vocab):
        raise GGError(f"model: token_embd ne={tok_embd.ne} does not match n_embd={hp.n_embd}, n_vocab={hp.n_vocab}")
    layers, biases = [], []
    e, g = hp.n_embd, hp.n_embd_gqa
    for il in range(hp.n_layer):
        names = _layer_names(il)
        ts = {k: up(n) for k, n in names.items()}
        wqkv = stacked([f"blk.{il}.attn_{x}.weight" for x in "qkv"], f"blk.{il}.attn_qkv.weight")
        if wqkv.ne[:2] != (e, e + 2 * g):
            raise GGError(f"model: layer {il} q/k/v weights stack to ne={wqkv.ne}, expected ({e}, {e + 2 * g})")
        row = wqkv.nb[1]
        ts["wq"] = ops.view_2d(wqkv, e, e, row, 0)
        ts["wk"] = ops.view_2d(wqkv, e, g, row, e * row)
        ts["wv"] = ops.view_2d(wqkv, e, g, row, (e + g) * row)
        layers.append(gl.LayerWeights(**ts, wqkv=wqkv))
        biases.append(stacked([f"blk.{il}.attn_{x}.bias" for x in "qkv"], f"blk.{il}.attn_qkv.bias")
                      if hp.qkv_bias else None)
    output_norm = up("output_norm.weight")
    output = tok_embd if tied else up("output.weight")
    bar.close()
    return ModelWeights(tok_embd, output, output_norm, layers, biases, tied)


def gg_config(hp: HParams, n_ctx: int) -> gl.Config:
    return gl.Config(n_embd=hp.n_embd, n_head=hp.n_head, n_head_kv=hp.n_head_kv, n_ff=hp.n_ff, n_ctx=n_ctx,
                     n_layer=hp.n_layer, rope_mode=hp.rope_mode, rope_base=hp.rope_base,
                     rope_scale=hp.rope_scale, eps=hp.eps)


def uses_plain_block(hp: HParams) -> bool:
    """gg.llama.transformer_block covers the model: no bias, plain rope over the whole head."""
    return not hp.qkv_bias and hp.rope_factors is None and hp.rope_dims == hp.head_dim


# ---- rope with per-frequency factors, from tables ------------------------------------------------
class RopeTables:
    """Rope as out = x * C + (R x) * S, with C and S (head_dim, 1, T) input tables computed on the
    host for each batch's positions and R the fixed signed pair swap. This is how gg runs rope
    frequency factors (llama-3), which the rope op has no parameter for."""

    def __init__(self, hp: HParams, ctx: Context, n_tokens: int):
        hd, nd = hp.head_dim, hp.rope_dims
        half = nd // 2
        self.cos = ctx.new_tensor(F32, (hd, 1, n_tokens), name="inp_rope_cos")
        self.sin = ctx.new_tensor(F32, (hd, 1, n_tokens), name="inp_rope_sin")
        r = np.zeros((hd, hd), np.float32)   # numpy (out, in): (R x)[out] = sum_in r[out, in] x[in]
        pair = np.zeros(hd, np.int64)
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if hp.rope_mode != ROPE_NEOX else (i, i + half)
            r[a, b], r[b, a] = -1.0, 1.0
            pair[a] = pair[b] = i
        self.swap = ctx.tensor(r, name="rope_swap")
        factors = np.ones(half) if hp.rope_factors is None else np.asarray(hp.rope_factors, np.float64)
        if factors.shape != (half,):
            raise GGError(f"model: {factors.size} rope frequency factors, expected rope_dims / 2 = {half}")
        inv = hp.rope_scale * hp.rope_base ** (-np.arange(half) * 2.0 / nd) / factors
        self.inv_freq = inv[pair]            # per dim
        self.rotated = np.arange(hd) < nd
        self.n_tokens = n_tokens

    def bind(self, n_past: int) -> None:
        pos = np.arange(n_past, n_past + self.n_tokens, dtype=np.float64)
        theta = pos[:, None] * self.inv_freq[None, :]                            # (T, hd)
        c = np.where(self.rotated, np.cos(theta), 1.0)
        s = np.where(self.rotated, np.sin(theta), 0.0)
        self.cos.set(c.reshape(self.n_tokens, 1, -1).astype(np.float32))
        self.sin.set(s.reshape(self.n_tokens, 1, -1).astype(np.float32))

    def apply(self, x: Tensor) -> Tensor:
        return ops.add(ops.mul(x, self.cos), ops.mul(ops.mul_mat(self.swap, x), self.sin))


# ---- the per-graph inputs ---------------------------------------------------------------------
class Inputs:
    """Token ids plus gg.llama's Batch (positions, mask, cache rows) and, if needed, rope tables."""

    def __init__(self, hp: HParams, cfg: gl.Config, ctx: Context, n_tokens: int, n_past: int | None):
        self.tokens = ctx.new_tensor(I32, (n_tokens,), name="inp_tokens")
        self.batch = (gl.Batch.indexed(cfg, ctx, n_tokens) if n_past is None
                      else gl.Batch.fixed(cfg, ctx, n_tokens, n_past))
        self.tables = None if uses_plain_block(hp) else RopeTables(hp, ctx, n_tokens)

    def bind(self, ids: np.ndarray | None, n_past: int) -> None:
        """The inputs of tokens `ids` at n_past (ids None: the tokens are already in place, written
        by the previous decode step's feedback)."""
        if ids is not None:
            self.tokens.set(np.asarray(ids, np.int32))
        self.batch.bind(n_past)
        if self.tables is not None:
            self.tables.bind(n_past)


def block(gf: Graph, hp: HParams, cfg: gl.Config, w: gl.LayerWeights, bias: Tensor | None, cache: gl.KVCache,
          il: int, x: Tensor, inp: Inputs) -> Tensor:
    """gg.llama.transformer_block with a QKV bias and/or table rope (see module doc)."""
    batch = inp.batch
    T, hd, nh, nkv = batch.n_tokens, hp.head_dim, hp.n_head, hp.n_head_kv
    cur = ops.mul(ops.rms_norm(x, hp.eps), w.attn_norm)
    qkv = ops.mul_mat(w.wqkv, cur)
    if bias is not None:
        qkv = ops.add(qkv, bias)
    f, col = qkv.dtype.size, qkv.nb[1]
    qk = ops.view_3d(qkv, hd, nh + nkv, T, hd * f, col, 0)
    if inp.tables is not None:
        qk = inp.tables.apply(qk)
    else:
        qk = ops.rope(qk, batch.pos, n_dims=hp.rope_dims, mode=hp.rope_mode, freq_base=hp.rope_base,
                      freq_scale=hp.rope_scale)
    q = ops.view_3d(qk, hd, nh, T, qk.nb[1], qk.nb[2], 0)
    k = ops.view_3d(qk, hd, nkv, T, qk.nb[1], qk.nb[2], nh * qk.nb[1])
    v = ops.view_2d(qkv, hp.n_embd_gqa, T, col, (hp.n_embd + hp.n_embd_gqa) * f)
    k_cache, v_cache = gl._write_kv(gf, cfg, cache, il, k, v, batch)
    kq = ops.mul_mat(k_cache, ops.permute(q, 0, 2, 1, 3))
    kq = ops.soft_max(ops.add(ops.scale(kq, 1.0 / math.sqrt(hd)), batch.mask))
    cur = ops.permute(ops.mul_mat(v_cache, kq), 0, 2, 1, 3)
    cur = ops.reshape(cur if cur.is_contiguous() else ops.cont(cur), hp.n_embd, T)
    h = ops.add(ops.mul_mat(w.wo, cur), x)
    cur = ops.mul(ops.rms_norm(h, hp.eps), w.ffn_norm)
    cur = ops.mul(ops.silu(ops.mul_mat(w.w_gate, cur)), ops.mul_mat(w.w_up, cur))
    return ops.add(ops.mul_mat(w.w_down, cur), h)


@dataclass
class Forward:
    """One built graph: bind inputs, compute, read its single output. A greedy decode graph built
    with `feedback` also writes its argmax into its own token input, so the next step can be
    enqueued before this one's token is read back (`launch`)."""

    graph: Graph
    inputs: Inputs
    out: Tensor
    n_tokens: int
    want: str
    feedback: bool = False

    def run(self, ids: Sequence[int], n_past: int) -> np.ndarray:
        with gathered_writes():  # the inputs reach the GPU as one launch, not a copy each
            self.inputs.bind(np.asarray(ids, np.int32), n_past)
        self.graph.compute()
        return self.out.numpy()

    def launch(self, ids: Sequence[int] | None, n_past: int):
        """Enqueue one run (ids None: the tokens the previous run fed back) without waiting;
        returns the pending output (`.result()`)."""
        if ids is None and not self.feedback:
            raise GGError("model: this graph does not feed its tokens back; pass the token ids")
        with gathered_writes():
            self.inputs.bind(None if ids is None else np.asarray(ids, np.int32), n_past)
        self.graph.compute(sync=False)
        return self.out.numpy_async()


def build_forward(hp: HParams, cfg: gl.Config, w: ModelWeights, cache: gl.KVCache, ctx: Context,
                  n_tokens: int, n_past: int | None, head: str = "all", want: str = "logits",
                  backends: Sequence[str] | None = None, feedback: bool = False) -> Forward:
    """The whole model over `n_tokens` token ids at `n_past` (None: an indexed graph that serves any
    position). head="all": logits of every token; "last": the last token's only. want="logits" or
    "argmax" (the I32 id of each row's largest logit). feedback (one token, argmax): the graph
    also copies its argmax into its token input, the next step's token."""
    if head not in ("all", "last") or want not in ("logits", "argmax"):
        raise GGError(f"model: head must be 'all' or 'last' and want 'logits' or 'argmax', got {head!r}, {want!r}")
    if feedback and (n_tokens != 1 or want != "argmax"):
        raise GGError(f"model: feedback needs a one-token argmax graph, got n_tokens={n_tokens}, want={want!r}")
    inp = Inputs(hp, cfg, ctx, n_tokens, n_past)
    gf = Graph(backends=backends)
    cur = ops.get_rows(w.tok_embd, inp.tokens)                     # (n_embd, T) F32
    plain = uses_plain_block(hp)
    for il, lw in enumerate(w.layers):
        if plain:
            cur = gl.transformer_block(gf, cfg, lw, cache, il, cur, inp.batch)
        else:
            cur = block(gf, hp, cfg, lw, w.qkv_bias[il], cache, il, cur, inp)
    if head == "last" and n_tokens > 1:                             # the head is the costliest product
        cur = ops.view_2d(cur, hp.n_embd, 1, cur.nb[1], (n_tokens - 1) * cur.nb[1])
    cur = ops.mul(ops.rms_norm(cur, hp.eps), w.output_norm)
    out = ops.mul_mat(w.output, cur)                                # (n_vocab, T')
    if want == "argmax":
        out = ops.argmax(out)
    out.name = "result_" + want
    gf.build_forward_expand(out)
    if feedback:  # after the argmax, which reads everything the token input fed: no hazard
        gf.build_forward_expand(ops.cpy(out, inp.tokens))
    return Forward(gf, inp, out, n_tokens, want, feedback)


__all__ = ["ModelWeights", "load_weights", "gg_config", "build_forward", "Forward", "Inputs", "block",
           "RopeTables", "uses_plain_block", "notice_once"]
