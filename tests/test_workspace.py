"""Memory a kernel needs besides its tensors is planned with the arenas (CUDA plans, no GPU):
tables (rope frequencies) for the plan's whole life, scratch (flash-decoding partials) while
their step runs; neither overlaps a tensor alive at the same time, and peak_bytes counts them."""
from __future__ import annotations

import pytest

import gg
from gg import llama as L


@pytest.mark.parametrize("T,rope_mode", [(1, 0), (5, 0), (5, 2), (1, 2)])
def test_tables_and_scratch_never_overlap_live_tensors(T, rope_mode):
    cfg = L.Config(n_embd=128, n_head=4, n_head_kv=2, n_ff=160, n_ctx=32, n_layer=2, rope_mode=rope_mode)
    w = L.Weights.random(cfg, gg.Context(), seed=1)
    batch = L.Batch.indexed(cfg, gg.Context(), T) if T == 1 else L.Batch.fixed(cfg, gg.Context(), T, 0)
    g, _, _ = L.build_forward_pass(cfg, w, L.KVCache(cfg, gg.Context()), batch, backends=("cuda",))
    plan = g.plan
    alloc = plan.alloc
    kinds = {kind for (_, kind) in alloc.workspace}
    assert "table" in kinds and (T == 1 or "scratch" in kinds)
    n = len(plan.steps)
    for (step, kind), (_, off) in alloc.workspace.items():
        nbytes = getattr(step.choice, kind)
        i = plan.steps.index(step)
        alive = range(n) if kind == "table" else range(i, i + 1)
        for b in alloc.blocks:
            if any(b.first <= j <= b.last for j in alive):
                assert off + nbytes <= b.offset or b.offset + b.nbytes <= off, (kind, i, b)
        assert off + nbytes <= alloc.arena_bytes["cuda"] <= plan.peak_bytes
