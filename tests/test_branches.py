"""Which steps of a captured CUDA graph may run on the side stream (gg/backends/cuda/branches.py):
dependencies come from device byte ranges, so arena reuse counts as a conflict. No GPU needed:
the addresses are made up."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import gg
from gg.backends.cuda import branches
from gg.backends.cuda.launch import Launch


def _tensors(names):
    ctx = gg.Context(backend="cpu")
    return [ctx.tensor(np.zeros(256, np.float32), name=n) for n in names]


def _plan(monkeypatch, base: dict[str, int], flow: list[tuple[tuple[str, ...], str]], kinds=None):
    names = sorted({n for ins, out in flow for n in ins + (out,)})
    ts = dict(zip(names, _tensors(names)))
    monkeypatch.setattr("gg.backends.cuda.launch.addr", lambda t: base[t.root.name] + t.view_offs)
    steps = [SimpleNamespace(inputs=tuple(ts[n] for n in ins), out=ts[out], outs=(ts[out],)) for ins, out in flow]
    launch = Launch.__new__(Launch)
    per_step = [[kinds[i] if kinds else launch] for i in range(len(flow))]
    return steps, per_step


# the decode step's shape: qkv -> rope -> K write; V write from qkv; attention reads both caches
FLOW = [(("x",), "qkv"), (("qkv",), "rope"), (("rope",), "K"), (("qkv",), "V"), (("K", "V", "rope"), "o")]


def test_the_v_write_runs_beside_rope_and_the_k_write(monkeypatch):
    base = {n: i * 4096 for i, n in enumerate(["x", "qkv", "rope", "K", "V", "o"])}
    steps, per_step = _plan(monkeypatch, base, FLOW)
    assert branches.side_steps(steps, per_step) == [branches.Branch(step=3, after=0, join=4)]


def test_arena_reuse_is_a_conflict(monkeypatch):
    # the V write's output on top of rope's bytes (as if the allocator had reused them): it must
    # wait for the K write that reads them - no branch left
    base = {"x": 0, "qkv": 4096, "rope": 8192, "K": 12288, "V": 8192, "o": 20480}
    steps, per_step = _plan(monkeypatch, base, FLOW)
    assert branches.side_steps(steps, per_step) == []


def test_a_later_reader_is_the_join(monkeypatch):
    # a step reading only leaves forks at the start (after = -1) and joins at its first reader;
    # the next one, independent of it, also leaves (the side stream keeps the two in order)
    flow = [(("x",), "a"), (("a",), "b"), (("w",), "c"), (("b",), "d"), (("c", "d"), "e")]
    base = {n: i * 4096 for i, n in enumerate(["x", "a", "b", "w", "c", "d", "e"])}
    steps, per_step = _plan(monkeypatch, base, flow)
    assert branches.side_steps(steps, per_step) == [branches.Branch(step=2, after=-1, join=4),
                                                    branches.Branch(step=3, after=1, join=4)]


def test_a_branch_waits_for_the_main_step_it_conflicts_with(monkeypatch):
    # found by the fuzzer on the H100: "e" reuses the bytes "c" reads (arena reuse) and reads the
    # leaf write "w" that ran on the side stream from the start. Waiting for the side step's event
    # alone let "e" overwrite "c"'s input while "c" still ran on the main stream.
    flow = [(("x",), "a"), (("a",), "b"), (("b",), "c"), (("y",), "w"), (("w",), "s"), (("s",), "t"),
            (("w",), "e")]
    base = {n: i * 4096 for i, n in enumerate(["x", "a", "c", "y", "w", "s", "t"])}
    base["b"] = base["e"] = 1 << 20
    steps, per_step = _plan(monkeypatch, base, flow)
    got = branches.side_steps(steps, per_step)
    assert branches.Branch(step=3, after=-1, join=4) in got
    assert branches.Branch(step=6, after=2, join=7) in got  # after "c" (main), not after "w" (side)


@pytest.mark.parametrize("kind", ["cublas", "empty"])
def test_only_gg_kernels_leave_the_main_stream(monkeypatch, kind):
    base = {n: i * 4096 for i, n in enumerate(["x", "qkv", "rope", "K", "V", "o"])}
    other = [] if kind == "empty" else [object()]
    launch = Launch.__new__(Launch)
    steps, _ = _plan(monkeypatch, base, FLOW)
    per_step = [[launch], [launch], [launch], other, [launch]]
    assert branches.side_steps(steps, per_step) == []


@pytest.mark.cuda
@pytest.mark.parametrize("n_head_kv", [4, 2])
def test_llama_steps_with_branches_equal_serial_steps(rng, monkeypatch, n_head_kv):
    """A prefill then decode steps of the llama block: the prefill's captured graph carries the
    V cache write as a branch (the decode step writes both caches in its QKV product's epilogue,
    so it may have none), and every output (and the cache) is bit-identical with branches off."""
    from gg import llama as L
    cfg = L.Config(n_embd=256, n_head=4, n_head_kv=n_head_kv, n_ctx=64)
    x = rng.standard_normal((12, cfg.n_embd)).astype(np.float32)
    runs = []
    for off in ("0", "1"):
        monkeypatch.setenv("GG_NO_BRANCHES", off)
        sess = L.Session(cfg, L.Weights.random(cfg, gg.Context(), seed=3), backends=("cuda",))
        outs = [sess.prefill(x[:8])] + [sess.decode(x[i:i + 1]) for i in range(8, 12)]
        progs = [seg for e in sess.fixed.values() for seg in e.graph._executor.segments if hasattr(seg, "branches")]
        dec = [seg for seg in sess.decoder.graph._executor.segments if hasattr(seg, "branches")]
        runs.append((outs, sess.cache.keys(0), sess.cache.values(0), [len(p.branches) for p in progs],
                     sum(len(p.branches) for p in dec)))
    (a, ka, va, na, _), (b, kb, vb, nb, nd) = runs
    assert na and all(n >= 1 for n in na) and not any(nb) and nd == 0, (na, nb, nd)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert np.array_equal(ka, kb) and np.array_equal(va, vb)
