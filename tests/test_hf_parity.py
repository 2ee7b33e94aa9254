"""gg runs a Hugging Face checkpoint as transformers does (issue 18): tiny random llama and qwen2
models written by transformers itself (`save_pretrained`, safetensors), loaded with gg.load, logits
compared with transformers' own forward pass in float32 (NMSE <= 1e-5; measured ~6e-9), greedy
generations of 32 tokens identical to transformers' generate, and the checkpoint converted to GGUF
by our own writer giving the same logits — an implementation nobody here wrote. Needs torch and
transformers (the GPU machine has both; a CPU torch works too): `pytest -m model tests/test_hf_parity.py`."""
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
                  rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)  # no end token: both generate the full length
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
    assert _nmse(got, want) <= 1e-5, _nmse(got, want)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", {}), ("llama", {"tie_word_embeddings": True})])
def test_greedy_generation_matches_transformers(tmp_path, arch, extra):
    hf = _write(tmp_path, arch, **extra)
    ids = [5, 17, 42, 101, 7, 63, 150]
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    m = gg.load(tmp_path, backends=_backends()[0], n_ctx=64)
    got = list(m.generate_ids(ids, max_tokens=32))
    assert len(want) == 32 and got == want


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_checkpoint_converted_to_gguf_gives_the_same_logits(tmp_path, arch):
    """transformers' weights written as a GGUF by our own writer (tests/gguf_writer.py: llama's q/k
    permuted for NORMAL rope, as llama.cpp's converter does): the GGUF path and the checkpoint path
    give transformers' logits."""
    from gg.models.hf_checkpoint import gguf_name
    from gguf_writer import Q, write
    hf = _write(tmp_path / "hf", arch)
    w = {gguf_name(k): v.detach().numpy() for k, v in hf.state_dict().items() if gguf_name(k)}
    write(tmp_path / "m.gguf", arch, w, n_head=6, n_head_kv=2, eps=1e-5, base=10000.0,
          types={k: Q.F32 for k in w}, n_ctx=256)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, 211, 29)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    from_gguf = gg.load(tmp_path / "m.gguf", backends=("cpu",), n_ctx=64).logits(ids)
    from_hf = gg.load(tmp_path / "hf", backends=("cpu",), n_ctx=64).logits(ids)
    assert _nmse(from_gguf, want) <= 1e-5 and _nmse(from_hf, want) <= 1e-5
    assert _nmse(from_gguf, from_hf) <= 1e-5
