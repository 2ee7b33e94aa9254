"""The public model: `gg.models.load(path)` -> Model (tokenize, detokenize, logits, generate)."""
from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .. import llama as gl
from ..backends import base
from ..context import Context
from ..errors import GGError
from . import chat as chat_mod
from . import hparams as hpm
from . import tokenizer as tokm
from .generate import stream_text
from .gguf_file import GGUFFile
from .hf_checkpoint import HFCheckpoint
from .llama import Forward, build_forward, gg_config, load_weights
from .sampling import Sampler, SamplerParams

DEFAULT_N_CTX = 4096   # the cache a model gets unless n_ctx says otherwise (capped at its training length)
# The cache holds n_ctx rounded up to this many positions (zeros, always masked): a transposed F16 V
# row of n_ctx positions is then 16-byte aligned, which the fast attention builds need (n_ctx = 129,
# `gg bench -p 0`'s, had fallen to the generic build: SmolLM2 tg128 773 tokens/s instead of ~1,500).
CACHE_ALIGN = 8
UBATCH = 512           # prefill chunk: longer prompts run as several graphs
MAX_GRAPHS = 8         # built graphs kept (each holds its plan's memory)
DECODE_AHEAD = 3       # greedy decode steps enqueued before the oldest one's token is read back


@dataclass
class Stats:
    """Timings of the last generate call (what `python -m gg run` prints)."""

    n_prompt: int = 0
    t_prompt: float = 0.0
    n_gen: int = 0
    t_gen: float = 0.0
    timings: list = field(default_factory=list)


class Model:
    """A llama / qwen2 model whose whole forward pass is gg graphs.

    `tokenize`, `detokenize`, `logits(ids)` (a fresh sequence each call), `generate(prompt, ...)`
    (an iterator of text pieces), `plan` (the decode graph's plan), `info()`."""

    def __init__(self, path: str, backends: Sequence[str] | None = None, n_ctx: int | None = None,
                 ubatch: int = UBATCH, progress: bool | None = None, devices: int | None = None):
        self.path = os.fspath(path)
        if devices is not None:  # a layer split over that many CUDA devices (gg.graph.assign)
            if backends is not None:
                raise GGError("load: give backends or devices, not both")
            if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
                raise GGError(f"load: devices must be a positive int, got {devices!r}")
            backends = tuple("cuda" if i == 0 else f"cuda:{i}" for i in range(devices)) + ("cpu",)
        self.backends = tuple(backends) if backends is not None else None
        t0 = time.perf_counter()
        if os.path.isdir(self.path):
            src = HFCheckpoint(self.path)
            self.hparams = hpm.from_hf_config(src.config, self.path)
            self.tokenizer = tokm.from_hf_dir(self.path, src.config) if src.file("tokenizer.json") else None
            self.chat_template = tokm.hf_chat_template(self.path)
            self.format = "safetensors"
        else:
            src = GGUFFile(self.path)
            hpm.check_arch(src.arch, self.path)
            factors = None
            if src.has("rope_freqs.weight"):
                factors = tuple(float(x) for x in np.asarray(src.tensor("rope_freqs.weight").raw, np.float32).reshape(-1))
            n_vocab = src.tensor("token_embd.weight").ne[1] if src.has("token_embd.weight") else 0
            self.hparams = hpm.from_gguf(src, n_vocab, factors)
            self.tokenizer = tokm.from_gguf(src) if src.get("tokenizer.ggml.model") else None
            self.chat_template = src.get("tokenizer.chat_template")
            self.format = "gguf"
        hp = self.hparams
        self.name = os.path.basename(self.path.rstrip(os.sep))
        n_ctx = min(DEFAULT_N_CTX, hp.n_ctx_train) if n_ctx is None else int(n_ctx)
        if n_ctx < 1:
            raise GGError(f"model: n_ctx must be >= 1, got {n_ctx}")
        if not isinstance(ubatch, int) or ubatch < 1:
            raise GGError(f"model: ubatch must be an integer >= 1, got {ubatch!r}")
        self.ubatch = ubatch
        self.ctx = Context()
        self.weights = load_weights(src, hp, self.ctx, progress)
        self._graphs: OrderedDict[tuple, Forward] = OrderedDict()
        self._decoders: dict[str, Forward] = {}
        self._set_n_ctx(n_ctx)
        self.load_seconds = time.perf_counter() - t0
        self.stats = Stats()
        self._src_desc = self._describe_types(src)

    # ---- text ---------------------------------------------------------------------------------
    def _tok(self) -> tokm.Tokenizer:
        if self.tokenizer is None:
            raise GGError(f"model: {self.path} carries no tokenizer; pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text` (BOS first where the model asks for it and add_special is True)."""
        return self._tok().encode(text, add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok().decode(list(ids))

    def chat_prompt(self, messages: Sequence[dict] | str, add_generation_prompt: bool = True) -> str:
        """The chat template rendered for `messages` (a str is one user message)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        tok = self._tok()
        bos = tok.token_text(tok.bos) if tok.bos is not None else ""
        eos = tok.token_text(tok.eos) if tok.eos is not None else ""
        return chat_mod.render(self.chat_template, messages, add_generation_prompt, bos_token=bos, eos_token=eos)

    # ---- graphs -------------------------------------------------------------------------------
    def _set_n_ctx(self, n_ctx: int) -> None:
        """A new, empty KV cache of n_ctx positions; the graphs built on the old one are dropped.
        `gg bench` runs its tg test in a cache of n_gen positions this way, as llama-bench runs each
        test in a context of its own tokens (n_ctx = n_prompt + n_gen), without loading the weights
        again."""
        self._graphs.clear()
        self._decoders.clear()
        self.n_ctx = n_ctx
        self.cfg = gg_config(self.hparams, -(-n_ctx // CACHE_ALIGN) * CACHE_ALIGN)  # n_ctx itself bounds the tokens
        self.cache = gl.KVCache(self.cfg, self.ctx)

    def _fixed(self, n_tokens: int, n_past: int, head: str, want: str) -> Forward:
        key = (n_tokens, n_past, head, want)
        fw = self._graphs.get(key)
        if fw is None:
            fw = build_forward(self.hparams, self.cfg, self.weights, self.cache, self.ctx, n_tokens, n_past,
                               head, want, self.backends)
            self._graphs[key] = fw
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return fw

    def _decoder(self, want: str) -> Forward:
        fw = self._decoders.get(want)
        if fw is None:
            fw = build_forward(self.hparams, self.cfg, self.weights, self.cache, self.ctx, 1, None, "last", want,
                               self.backends, feedback=want == "argmax")
            self._decoders[want] = fw
        return fw

    @property
    def plan(self):
        """The plan of the greedy decode graph (one token in, its argmax out)."""
        return self._decoder("argmax").graph.plan

    def _check_ids(self, ids: Sequence[int]) -> np.ndarray:
        a = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise GGError(f"model: token ids must be a non-empty 1-d sequence of integers, got shape {a.shape} {a.dtype}")
        if a.min() < 0 or a.max() >= self.hparams.n_vocab:
            raise GGError(f"model: token ids must be in [0, {self.hparams.n_vocab}), got min {a.min()} max {a.max()}")
        return a.astype(np.int32)

    def _prefill(self, ids: np.ndarray, head: str, want: str) -> list[np.ndarray]:
        """Run `ids` at the cache's n_past in chunks of ubatch; returns each chunk's result."""
        if self.cache.n_past + ids.size > self.n_ctx:
            raise GGError(f"model: {ids.size} tokens at position {self.cache.n_past} do not fit the context of "
                          f"n_ctx={self.n_ctx} tokens (load with a larger n_ctx)")
        outs = []
        for i in range(0, ids.size, self.ubatch):
            chunk = ids[i:i + self.ubatch]
            last = i + self.ubatch >= ids.size
            fw = self._fixed(chunk.size, self.cache.n_past, head if last or head == "all" else "last",
                             want if last else "logits")
            out = fw.run(chunk, self.cache.n_past)
            self.cache.n_past += chunk.size
            outs.append(out)
        return outs

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits (T, n_vocab) of every position of `ids`, as a fresh sequence (the cache restarts)."""
        a = self._check_ids(ids)
        self.cache.clear()
        outs = self._prefill(a, "all", "logits")
        return np.concatenate([o.reshape(-1, self.hparams.n_vocab) for o in outs], axis=0)

    # ---- generation ---------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, seed: int | None = None) -> Iterator[int]:
        """Generated token ids after the prompt `ids` (a fresh sequence), up to max_tokens or the end
        of the context. Greedy decoding reads back only the argmax computed in the graph."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 0:
            raise GGError(f"generate: max_tokens must be an integer >= 0, got {max_tokens!r}")
        params = SamplerParams(float(temperature), top_k, float(top_p))
        sampler = Sampler(params, seed)
        a = self._check_ids(ids)
        want = "argmax" if params.greedy else "logits"
        st = self.stats = Stats(n_prompt=int(a.size))
        if max_tokens == 0:
            return
        self.cache.clear()
        t0 = time.perf_counter()
        out = self._prefill(a, "last", want)[-1]
        st.t_prompt = time.perf_counter() - t0
        t0 = time.perf_counter()
        if params.greedy:
            first = int(out.reshape(-1)[0])
            for n, tok in enumerate(itertools.chain((first,), self.decode_greedy(first, max_tokens - 1))):
                st.n_gen, st.t_gen = n + 1, time.perf_counter() - t0
                yield tok
            return
        dec = self._decoder(want)
        for n in range(max_tokens):
            tok = sampler(out)
            st.n_gen, st.t_gen = n + 1, time.perf_counter() - t0
            yield tok
            if n + 1 == max_tokens or self.cache.n_past >= self.n_ctx:
                return
            out = dec.run([tok], self.cache.n_past)
            self.cache.n_past += 1

    def decode_greedy(self, token: int, n: int) -> Iterator[int]:
        """Up to n greedy tokens after `token` (at the cache's n_past; it stops at the end of the
        context). The decode graph feeds its argmax back into its own token input, so on a GPU
        DECODE_AHEAD steps are enqueued before the first token is read back: the host's work for a
        token (inputs, launch, readback) runs while the GPU computes the ones before it. Steps
        enqueued past where the caller stops only write cache rows past n_past (masked, and
        overwritten later)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise GGError(f"decode_greedy: n must be an integer >= 0, got {n!r}")
        token = int(self._check_ids([token])[0])
        dec = self._decoder("argmax")
        ahead = DECODE_AHEAD if any(base.is_cuda(s.backend) for s in dec.graph.plan.steps) else 1
        start = self.cache.n_past
        limit = min(n, self.n_ctx - start)
        pending: deque = deque()
        launched = 0
        while True:
            while len(pending) < ahead and launched < limit:
                pending.append(dec.launch([token] if launched == 0 else None, start + launched))
                launched += 1
            if not pending:
                return
            tok = int(pending.popleft().result().reshape(-1)[0])
            self.cache.n_past += 1
            yield tok

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 stop: Sequence[str] = ()) -> Iterator[str]:
        """Text pieces generated after `prompt` (text, or token ids), streamed as they are decoded.
        chat=True wraps the prompt in the model's chat template. Ends at EOS, a stop string, or
        max_tokens."""
        tok = self._tok()
        if isinstance(stop, str):
            stop = (stop,)
        if isinstance(prompt, str):
            ids = tok.encode(self.chat_prompt(prompt), add_special=False) if chat else tok.encode(prompt)
        else:
            if chat:
                raise GGError("generate: chat=True needs a text prompt")
            ids = list(prompt)
        tokens = self.generate_ids(ids, max_tokens, temperature, top_k, top_p, seed)
        return stream_text(tokens, tok.decode, tok.eos_ids, stop)

    # ---- description --------------------------------------------------------------------------
    @staticmethod
    def _describe_types(src) -> dict[str, int]:
        import gguf
        counts: dict[str, int] = {}
        for n in src.names():
            t = src.tensor(n).ggml_type
            try:
                name = gguf.GGMLQuantizationType(t).name
            except ValueError:
                name = str(t)
            counts[name] = counts.get(name, 0) + 1
        return counts

    def info(self) -> dict:
        """Architecture, sizes, stored and loaded tensor types, memory."""
        hp = self.hparams
        leaves = [self.weights.tok_embd, self.weights.output_norm] + ([] if self.weights.tied else [self.weights.output])
        for lw in self.weights.layers:
            leaves += [lw.attn_norm, lw.wqkv, lw.wo, lw.ffn_norm, lw.w_gate, lw.w_up, lw.w_down]
        leaves += [b for b in self.weights.qkv_bias if b is not None]
        loaded: dict[str, int] = {}
        for t in leaves:
            loaded[t.dtype.name] = loaded.get(t.dtype.name, 0) + 1
        kv_bytes = sum(t.nbytes for t in self.cache.k + self.cache.v)
        return {
            "path": self.path, "format": self.format, "arch": hp.arch, "n_vocab": hp.n_vocab, "n_embd": hp.n_embd,
            "n_layer": hp.n_layer, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv, "n_ff": hp.n_ff,
            "n_ctx": self.n_ctx, "n_ctx_train": hp.n_ctx_train, "rope_base": hp.rope_base,
            "rope": "normal" if hp.rope_mode == 0 else "neox", "tied_output": self.weights.tied,
            "n_params": int(sum(t.nelements for t in leaves)), "stored_types": self._src_desc,
            "loaded_types": loaded, "weight_bytes": int(sum(t.nbytes for t in leaves)), "kv_cache_bytes": int(kv_bytes),
            "load_seconds": round(self.load_seconds, 2),
        }


def load(path: str | os.PathLike, backends: Sequence[str] | None = None, n_ctx: int | None = None,
         **kwargs) -> Model:
    """Load a GGUF file or a Hugging Face checkpoint directory (llama, qwen2). `devices=N` splits
    the layers over CUDA devices cuda, cuda:1, ... cuda:N-1 (same as backends=("cuda", ..., "cpu"))."""
    return Model(path, backends=backends, n_ctx=n_ctx, **kwargs)
