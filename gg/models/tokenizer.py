"""Tokenizers built from GGUF metadata (or a checkpoint's tokenizer.json) on the `tokenizers`
package: gpt2-style byte-level BPE with the pre-tokenizer split chosen by `tokenizer.ggml.pre`, and
llama/SentencePiece BPE with byte fallback. gg writes no BPE of its own."""
from __future__ import annotations

import json
import os
from typing import Sequence

from ..errors import GGError

# Pre-tokenizer splits by `tokenizer.ggml.pre` (the regexes the vocabularies were trained with).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {"gpt2": _GPT2, "default": _GPT2, "smollm": _GPT2, "llama-bpe": _LLAMA3, "llama3": _LLAMA3,
              "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3, "qwen2": _QWEN2,
              "deepseek-r1-qwen": _QWEN2}
CONTROL, USER_DEFINED = 3, 4


def _tk():
    try:
        import tokenizers
    except ImportError:
        raise GGError("tokenizer: gg builds tokenizers with the `tokenizers` package: pip install tokenizers") from None
    return tokenizers


def _byte_level(tokens: Sequence[str], merges: Sequence[str], pre: str | None):
    tk = _tk()
    from tokenizers import Regex, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = tk.Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
    split = PRE_SPLITS.get(pre or "default")
    if split is None:
        from .weights import notice_once
        notice_once(f"pre:{pre}", f"gg: tokenizer pre-tokenizer '{pre}' is unknown; using gpt2's split "
                                  f"(known: {', '.join(sorted(PRE_SPLITS))})")
        split = _GPT2
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE stores scores, not merges: a merge (l, r) exists where l, r and l + r are all
    pieces, ranked by the merged piece's score (higher first), then by the pieces' ids."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for t, s in zip(tokens, scores):
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in ids and right in ids:
                found.append((-s, ids[left], ids[right], left, right))
    found.sort()
    return [(f[3], f[4]) for f in found]


def _sentencepiece(tokens: Sequence[str], scores: Sequence[float], unk: int | None, add_space_prefix: bool,
                   merges: Sequence[str] | None):
    tk = _tk()
    from tokenizers import decoders, models, normalizers
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges else _spm_merges(tokens, scores)
    unk_tok = tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None
    tok = tk.Tokenizer(models.BPE(vocab, pairs, unk_token=unk_tok, fuse_unk=True, byte_fallback=True))
    norm = [normalizers.Replace(" ", "\u2581")]
    if add_space_prefix:
        norm.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(norm)
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok


class Tokenizer:
    """encode/decode with BOS/EOS handling; `eos_ids` ends generation."""

    def __init__(self, backend, bos: int | None, eos: int | None, add_bos: bool, add_eos: bool = False,
                 extra_eos: Sequence[int] = ()):
        self.backend, self.bos, self.eos, self.add_bos, self.add_eos = backend, bos, eos, add_bos, add_eos
        self.eos_ids = frozenset([e for e in [eos, *extra_eos] if e is not None])
        self.n_vocab = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise GGError(f"tokenize: text must be a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos is not None:
            ids = [self.bos] + ids
        if add_special and self.add_eos and self.eos is not None:
            ids = ids + [self.eos]
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        bad = [i for i in ids if not 0 <= int(i) < self.n_vocab]
        if bad:
            raise GGError(f"detokenize: token ids {bad[:5]} are outside the vocabulary [0, {self.n_vocab})")
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_text(self, i: int) -> str:
        return self.backend.id_to_token(int(i)) or ""


def from_gguf(f) -> Tokenizer:
    """The tokenizer a GGUFFile describes under `tokenizer.ggml.*`."""
    from tokenizers import AddedToken
    model = f.get("tokenizer.ggml.model")
    tokens = f.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise GGError(f"tokenizer: {f.path} has no tokenizer (tokenizer.ggml.model / tokens)")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if model == "gpt2":
        backend = _byte_level(tokens, f.get("tokenizer.ggml.merges") or [], f.get("tokenizer.ggml.pre"))
        add_bos_default = False
    elif model == "llama":
        backend = _sentencepiece(tokens, f.get("tokenizer.ggml.scores") or [0.0] * len(tokens),
                                 f.get("tokenizer.ggml.unknown_token_id"),
                                 bool(f.get("tokenizer.ggml.add_space_prefix", True)), f.get("tokenizer.ggml.merges"))
        add_bos_default = True
    else:
        raise GGError(f"tokenizer: tokenizer.ggml.model '{model}' is not supported; gg builds 'gpt2' (byte-level "
                      "BPE) and 'llama' (SentencePiece BPE)")
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL and t]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED and t]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
    eot = f.get("tokenizer.ggml.eot_token_id")
    return Tokenizer(backend, f.get("tokenizer.ggml.bos_token_id"), f.get("tokenizer.ggml.eos_token_id"),
                     bool(f.get("tokenizer.ggml.add_bos_token", add_bos_default)),
                     bool(f.get("tokenizer.ggml.add_eos_token", False)), extra_eos=[eot] if eot is not None else ())


def from_hf_dir(path: str, config: dict) -> Tokenizer:
    """tokenizer.json (+ tokenizer_config.json for BOS/EOS and add_bos) of a checkpoint directory."""
    tk = _tk()
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tj):
        raise GGError(f"tokenizer: {path} has no tokenizer.json")
    backend = tk.Tokenizer.from_file(tj)
    tc = {}
    if os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        with open(os.path.join(path, "tokenizer_config.json")) as fh:
            tc = json.load(fh)

    def tid(key: str, cfg_key: str):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            return backend.token_to_id(v)
        v = config.get(cfg_key)
        return v[0] if isinstance(v, list) else v
    # tokenizer.json's post-processor already adds BOS where the model wants it
    return Tokenizer(backend, tid("bos_token", "bos_token_id"), tid("eos_token", "eos_token_id"), add_bos=False)


def hf_chat_template(path: str) -> str | None:
    p = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(p):
        with open(p) as fh:
            t = json.load(fh).get("chat_template")
        if isinstance(t, str):
            return t
    p = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(p):
        with open(p) as fh:
            return fh.read()
    return None
