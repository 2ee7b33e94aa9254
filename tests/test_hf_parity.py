"""gg runs a Hugging Face checkpoint as transformers does (issue 18): tiny random llama and qwen2
models written by transformers itself (`save_pretrained`, safetensors), loaded with gg.load, logits
compared with transformers' own forward pass in float32 — an implementation nobody here wrote.
Needs torch and transformers (the GPU machine has both): `pytest -m model tests/test_hf_parity.py`."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends import base

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.model


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / (b ** 2).sum())


def _write(tmp_path, arch: str, **extra):
    common = dict(vocab_size=211, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=False)
    common.update(extra)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # larger than the default init so every layer matters to the logits
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model = model.float().eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


def _backends():
    return (("cuda", "cpu"),) if base.available("cuda") else (("cpu",),)


@pytest.mark.parametrize("backends", _backends() + (("cpu",),))
@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", {}), ("llama", {"tie_word_embeddings": True}),
                                        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}})])
def test_logits_match_transformers(tmp_path, arch, extra, backends):
    hf = _write(tmp_path, arch, **extra)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 211, 37)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    m = gg.load(tmp_path, backends=backends, n_ctx=64)
    got = m.logits(ids)
    assert got.shape == want.shape
    # gg stores float weights as F16 (an F16 rounding of every weight, F32 accumulation)
    assert _nmse(got, want) <= 1e-4, _nmse(got, want)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
