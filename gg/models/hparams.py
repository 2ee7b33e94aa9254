"""Model hyper-parameters, read from GGUF metadata or a Hugging Face config.json."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import GGError
from ..ops import ROPE_NEOX, ROPE_NORMAL

ARCHS = ("llama", "qwen2")  # the architectures gg builds graphs for
HF_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    eps: float
    rope_base: float
    rope_dims: int
    rope_mode: int        # NORMAL for GGUF llama (q/k rows stored permuted), NEOX otherwise
    rope_scale: float = 1.0  # linear position scaling (1 / factor)
    qkv_bias: bool = False
    rope_factors: tuple[float, ...] | None = None  # llama-3 per-frequency divisors (rope_dims / 2)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        return self.head_dim * self.n_head_kv


def check_arch(arch: str, source: str) -> str:
    if arch not in ARCHS:
        raise GGError(f"model: architecture '{arch}' of {source} is not supported; gg runs {', '.join(ARCHS)}")
    return arch


def from_gguf(f, n_vocab: int, rope_factors) -> HParams:
    """`f` is a GGUFFile; `n_vocab` comes from the embedding tensor (the authority)."""
    arch = check_arch(f.arch, f.path)
    g = lambda k, d=None: f.get(f"{arch}.{k}", d)  # noqa: E731
    n_embd, n_head = int(g("embedding_length")), int(g("attention.head_count"))
    scale = 1.0
    stype = g("rope.scaling.type")
    if stype == "linear":
        scale = 1.0 / float(g("rope.scaling.factor", 1.0))
    elif stype not in (None, "none"):
        raise GGError(f"model: rope scaling '{stype}' is not supported (gg supports none, linear and "
                      "llama-3 frequency factors)")
    head_dim = n_embd // n_head
    return HParams(
        arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_layer=int(g("block_count")), n_head=n_head,
        n_head_kv=int(g("attention.head_count_kv", n_head)), n_ff=int(g("feed_forward_length")),
        n_ctx_train=int(g("context_length", 2048)), eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(g("rope.freq_base", 10000.0)), rope_dims=int(g("rope.dimension_count", head_dim)),
        rope_mode=ROPE_NORMAL if arch == "llama" else ROPE_NEOX, rope_scale=scale,
        qkv_bias=arch == "qwen2", rope_factors=rope_factors)


def llama3_factors(rope_scaling: dict, base: float, dims: int) -> tuple[float, ...]:
    """Llama-3's per-frequency divisors: long wavelengths are slowed by `factor`, short ones kept,
    the band between blended smoothly (from the published rope_scaling definition)."""
    factor = float(rope_scaling["factor"])
    low, high = float(rope_scaling.get("low_freq_factor", 1.0)), float(rope_scaling.get("high_freq_factor", 4.0))
    old_ctx = float(rope_scaling.get("original_max_position_embeddings", 8192))
    freqs = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def from_hf_config(cfg: dict, path: str) -> HParams:
    archs = cfg.get("architectures") or []
    arch = next((HF_ARCHS[a] for a in archs if a in HF_ARCHS), None)
    if arch is None:
        raise GGError(f"model: architectures {archs} in {path}/config.json are not supported; gg runs "
                      f"{', '.join(HF_ARCHS)}")
    n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    if head_dim != n_embd // n_head:
        raise GGError(f"model: head_dim={head_dim} != hidden_size / num_attention_heads is not supported")
    base = float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rtype = rs.get("rope_type", rs.get("type", "default"))
    scale, factors = 1.0, None
    if rtype == "linear":
        scale = 1.0 / float(rs["factor"])
    elif rtype == "llama3":
        factors = llama3_factors(rs, base, head_dim)
    elif rtype not in ("default", None):
        raise GGError(f"model: rope_scaling type '{rtype}' is not supported (default, linear, llama3)")
    return HParams(
        arch=arch, n_vocab=int(cfg["vocab_size"]), n_embd=n_embd, n_layer=int(cfg["num_hidden_layers"]),
        n_head=n_head, n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        n_ff=int(cfg["intermediate_size"]), n_ctx_train=int(cfg.get("max_position_embeddings", 2048)),
        eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_base=base, rope_dims=head_dim, rope_mode=ROPE_NEOX,
        rope_scale=scale, qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        rope_factors=factors)
