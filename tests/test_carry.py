"""A norm carried across a step boundary (gg/graph/carry.py; CUDA: blocks.Vecs carry_out /
carry_in): the `rms_norm -> mul` step between a streaming product (+ residual) and the streaming
product(s) reading its row leaves the plan; the values equal the unfused plan's and float64's.
Plans need no GPU; values run with `pytest -m cuda`."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.backends.cuda import families, launch
from gg.backends.cuda.families import blocks, siblings
from reference import ref_mul_mat, ref_rms_norm, ref_silu
from reference_helpers import nmse, nmse_vs_reference
from test_quant_ops import random_weights

cuda = pytest.mark.cuda
CUDA = ("cuda", "cpu")
EPS = 1e-5
TYPES = [gg.Q8_0, gg.Q4_0, gg.Q4_1, gg.Q4_K, gg.Q6_K]


@pytest.fixture(autouse=True)
def _streaming(monkeypatch):
    """Small matrices stream (as an 8B model's do), and no norm fits a reader's prologue (as the
    8B ffn norm does not: gate/up's blocks would re-read 29 MB of norm weights)."""
    monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(siblings, "QUANT_NORM_BYTES_MAX", 0)
    monkeypatch.setattr(blocks, "CARRY_TYPES", tuple(TYPES))  # every type's builds (the default: those it speeds up)
    monkeypatch.setattr(blocks, "CARRY_INTO_PROLOGUE_TYPES", tuple(TYPES))


def rand(rng, *shape):
    return (rng.standard_normal(shape) * 0.5 + 0.05).astype(np.float32)


class Layer:
    """h = x + Wo·a; n = rms_norm(h) * w; then f = silu(Wg·n) * (Wu·n) and out = h + Wd·f (an ffn),
    or out = Wh·n (a head); float64 references over the dequantized weights."""

    def __init__(self, rng, dt, E, K, F, head=False):
        ctx = gg.Context()
        x, a, w = rand(rng, E) * 3, rand(rng, K), rand(rng, E) + 1.0
        self.x, self.a = ctx.tensor(x, name="x"), ctx.tensor(a, name="a")
        wo = random_weights(rng, dt, E, K, ctx)
        self.h = self.x + gg.mul_mat(wo, self.a)
        self.n = gg.mul(gg.rms_norm(self.h, EPS), ctx.tensor(w, name="norm_w"))
        hr = x + ref_mul_mat(wo.numpy(), a)
        nr = ref_rms_norm(hr, EPS) * w
        if head:
            wh = random_weights(rng, dt, F, E, ctx)
            self.out, self.ref = gg.mul_mat(wh, self.n), ref_mul_mat(wh.numpy(), nr)
        else:
            wg, wu, wd = (random_weights(rng, dt, F, E, ctx), random_weights(rng, dt, F, E, ctx),
                          random_weights(rng, dt, E, F, ctx))
            f = gg.mul(gg.silu(gg.mul_mat(wg, self.n)), gg.mul_mat(wu, self.n))
            self.out = self.h + gg.mul_mat(wd, f)
            fr = ref_silu(ref_mul_mat(wg.numpy(), nr)) * ref_mul_mat(wu.numpy(), nr)
            self.ref = hr + ref_mul_mat(wd.numpy(), fr)


def carried(plan) -> list[tuple[int, int]]:
    """(producer, reader) step indices of every carried norm in the plan."""
    steps = plan.steps
    return [(i - 1, i) for i, s in enumerate(steps)
            if getattr(getattr(s.choice, "vecs", None), "carry_in", 0)
            and steps[i - 1].choice.vecs.carry_out]


# ---- plans (no GPU) ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("head", [False, True])
@pytest.mark.parametrize("inline", [False, True])
def test_the_norm_between_two_streaming_products_leaves_the_plan(rng, dt, head, inline, monkeypatch):
    """inline: the norm fits the reader's prologue (a `_norm` build re-reading the norm weight,
    as an 8B QKV does): the producer carries it all the same."""
    if inline:
        monkeypatch.setattr(siblings, "QUANT_NORM_BYTES_MAX", 1 << 30)
        for switch, off, on in (("CARRY_NORM", 0, 1), ("CARRY_INTO_PROLOGUE_TYPES", (), (dt,))):
            monkeypatch.setattr(blocks, switch, off)  # without the carry: the prologue build
            plain = gg.build_forward(Layer(rng, dt, 512, 256, 768, head=head).out, backends=CUDA).plan
            assert "_norm" in plain.steps[1].kernel and not carried(plain)
            monkeypatch.setattr(blocks, switch, on)
    t = Layer(rng, dt, 512, 256, 768, head=head)
    plan = gg.build_forward(t.out, backends=CUDA).plan
    ops = [s.ops for s in plan.steps]
    assert ("rms_norm", "mul") not in ops and carried(plan) == [(0, 1)], str(plan)
    prod, reader = plan.steps[0].choice.vecs, plan.steps[1].choice.vecs
    assert plan.steps[1].ops[:2] == ("rms_norm", "mul")
    assert reader.carry_in == prod.row_blocks and not reader.norm
    assert plan.steps[0].choice.table == prod.table >= 4 * (prod.weight_rows + prod.row_blocks)
    assert [s.kernel for s in plan.steps[:2]] == [
        blocks.vecs_name(dt, prod.R, carry=True),
        blocks.vecs_name(dt, reader.R, carry=True) if head else blocks.sibs_name(dt, reader.R, "silu", carry=True)]


@pytest.mark.parametrize("dt", [gg.Q8_0, gg.Q4_0])
def test_a_norm_step_of_its_own_is_carried_without_the_prologue_types(rng, monkeypatch, dt):
    """A producer type outside blocks.CARRY_INTO_PROLOGUE_TYPES (Q4_0 by default) leaves readers
    that normalize on the way in alone, not the norm steps of their own."""
    monkeypatch.setattr(blocks, "CARRY_INTO_PROLOGUE_TYPES", tuple(t for t in TYPES if t != dt))
    plan = gg.build_forward(Layer(rng, dt, 512, 256, 768).out, backends=CUDA).plan
    assert carried(plan) == [(0, 1)], str(plan)
    monkeypatch.setattr(siblings, "QUANT_NORM_BYTES_MAX", 1 << 30)  # the reader normalizes on the way in
    plan = gg.build_forward(Layer(rng, dt, 512, 256, 768).out, backends=CUDA).plan
    assert not carried(plan) and "_norm" in plan.steps[1].kernel, str(plan)


def test_carried_norm_with_k_parts_on_both_sides(rng):
    """The producer's rows in K parts (the down projection's tickets, then the carried rows in its
    table after them) and a reader whose K (the producer's rows) is long enough for parts too."""
    t = Layer(rng, gg.Q8_0, 4352, 8448, 64)
    plan = gg.build_forward(t.out, backends=CUDA).plan
    assert carried(plan) == [(0, 1)], str(plan)
    prod, reader = plan.steps[0].choice.vecs, plan.steps[1].choice.vecs
    assert prod.parts > 1 and reader.parts > 1
    rows, ss = prod.carried_offsets()
    assert rows >= 4 * prod.row_blocks and rows % 16 == 0 and ss >= rows + 4 * prod.weight_rows


@pytest.mark.parametrize("case", ["kept", "second reader", "switch off", "no fusion", "producer does not stream",
                                  "cpu", "too many row blocks", "type left out"])
def test_the_norm_keeps_its_step(rng, monkeypatch, case):
    t = Layer(rng, gg.Q4_0, 512, 256, 768)
    outs, kw = [t.out], {}
    if case == "kept":
        t.n.keep()
    elif case == "second reader":
        outs.append(gg.scale(t.n, 2.0))
    elif case == "switch off":
        monkeypatch.setattr(blocks, "CARRY_NORM", False)
    elif case == "no fusion":
        kw["fuse"] = False
    elif case == "producer does not stream":  # Wo (512 x 256) below the streaming size, gate/up above
        monkeypatch.setattr(blocks, "MVS_MIN_ELEMENTS", 512 * 256 + 1)
    elif case == "too many row blocks":
        monkeypatch.setattr(blocks, "CARRY_MAX", 1)
    elif case == "type left out":  # (blocks.CARRY_TYPES: the types it measured faster on)
        monkeypatch.setattr(blocks, "CARRY_TYPES", (gg.Q8_0,))
    plan = gg.build_forward(*outs, backends=("cpu",) if case == "cpu" else CUDA, **kw).plan
    assert not carried(plan), str(plan)
    assert any(s.ops[:2] == ("rms_norm", "mul") and "mul_mat" not in s.ops for s in plan.steps) or case == "no fusion"


@pytest.mark.compile_all
def test_carried_launches_fit_their_kernels(rng):
    """The packed arguments of both ends match the CUBINs' signatures (NVRTC, no GPU), and the
    reader is given the producer's table: its rows as x, its sums of squares."""
    from test_kernel_contract import _lowered, mismatch
    graphs = [gg.build_forward(Layer(rng, dt, 512, 256, 768, head=head).out, backends=CUDA)
              for dt in TYPES for head in (False, True)]
    graphs.append(gg.build_forward(Layer(rng, gg.Q8_0, 4352, 8448, 64).out, backends=CUDA))
    rt, records = _lowered(graphs)
    assert not [m for m in (mismatch(rt, r) for r in records) if m]
    assert len(records) == sum(len(g.plan.steps) for g in graphs)


def test_a_reader_lowered_without_its_producer_is_refused(rng):
    """A reader's step lowered after anything but its producer (a timing script's step alone)
    is a BackendError, not a read of memory nobody wrote."""
    from test_kernel_contract import _FakeMemory, _FakeRuntime
    t = Layer(rng, gg.Q4_0, 512, 256, 768)
    reader = gg.build_forward(t.out, backends=CUDA).plan.steps[1]
    with launch.bound(_FakeMemory(), [reader]), pytest.raises(gg.BackendError, match="carried"):
        families.lower(_FakeRuntime(), reader, 0)


# ---- values (GPU) -----------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("head,inline", [(False, False), (True, False), (False, True)])
def test_cuda_carried_norm_equals_the_unfused_plan_and_float64(rng, dt, head, inline, monkeypatch):
    if inline:  # the reader's step had the norm in its prologue
        monkeypatch.setattr(siblings, "QUANT_NORM_BYTES_MAX", 1 << 30)
    t = Layer(rng, dt, 512, 256, 768, head=head)
    g = gg.build_forward(t.out, backends=CUDA)
    g.compute()
    assert carried(g.plan) == [(0, 1)]
    got = t.out.numpy()
    gp = gg.build_forward(t.out, backends=CUDA, fuse=False)
    gp.compute()
    plain = t.out.numpy()
    assert nmse(got, plain) <= nmse_vs_reference(g)
    assert nmse(got, t.ref.reshape(got.shape)) <= nmse_vs_reference(g)


@cuda
def test_cuda_carried_norm_with_k_parts_repeats_and_follows_its_input(rng):
    """Both ends in K parts (tickets reset by their last blocks): a second compute gives the same
    bits, and a new input row gives the new reference."""
    t = Layer(rng, gg.Q8_0, 4352, 8448, 64)
    g = gg.build_forward(t.out, backends=CUDA)
    g.compute()
    assert carried(g.plan) == [(0, 1)] and g.plan.steps[0].choice.vecs.parts > 1
    first = t.out.numpy()
    assert nmse(first, t.ref.reshape(first.shape)) <= nmse_vs_reference(g)
    g.compute()
    np.testing.assert_array_equal(t.out.numpy(), first)
    a2 = rand(rng, 8448)
    t.a.set(a2)
    g.compute()
    gp = gg.build_forward(t.out, backends=CUDA, fuse=False)
    gp.compute()
    plain = t.out.numpy()
    g.compute()
    assert nmse(t.out.numpy(), plain) <= nmse_vs_reference(g) and nmse(plain, first) > 1e-3
