"""A value gg returns is right, or gg raises a GGError that says why (issue 16's defects and the
rule in general): intermediates are refused unless kept, graphs sharing nodes never disturb each
other, reading a plan changes nothing, integers never wrap, careless arguments are GGErrors and
the CPU kernels raise no numpy warnings on the specials docs/numerics.md defines."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import gg
from reference import (nmse, ref_gelu, ref_get_rows, ref_norm, ref_rms_norm, ref_scale, ref_silu,
                       ref_soft_max)

CPU = ("cpu",)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- 1. intermediates: refused, or kept and right ------------------------------------------------
UNARY = {
    "rms_norm": (lambda t: gg.rms_norm(t, 1e-6), lambda a: ref_rms_norm(a, 1e-6)),
    "norm": (lambda t: gg.norm(t, 1e-5), lambda a: ref_norm(a, 1e-5)),
    "silu": (gg.silu, ref_silu),
    "gelu": (gg.gelu, ref_gelu),
    "scale": (lambda t: gg.scale(t, 0.75), lambda a: ref_scale(a, 0.75)),
    "soft_max": (gg.soft_max, ref_soft_max),
    "cont": (lambda t: gg.cont(gg.transpose(t)), lambda a: np.swapaxes(a, -1, -2)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_an_intermediate_is_refused_then_kept(op, rng):
    make, ref = UNARY[op]
    a = f32(rng, 5, 33)
    x = gg.tensor(a)
    h = make(x)
    y = gg.soft_max(gg.scale(h, 0.5))  # the scale may run in place over h
    gg.build_forward(y, backends=CPU).compute()
    with pytest.raises(gg.GraphError, match="intermediate.*keep"):
        h.numpy()
    g = gg.build_forward(y, backends=CPU, keep=[h])
    g.compute()
    assert nmse(h.numpy(), ref(a)) < 1e-7
    assert nmse(y.numpy(), ref_soft_max(ref_scale(ref(a), 0.5))) < 1e-6


def test_keep_after_planning_replans(rng):
    a = f32(rng, 3, 64)
    x = gg.tensor(a)
    n = gg.rms_norm(x, 1e-6)
    y = gg.mul(n, x)  # rms_norm+mul fuse: n has no memory of its own
    g = gg.build_forward(y, backends=CPU)
    g.compute()
    assert [s.ops for s in g.plan.steps] == [("rms_norm", "mul")]
    n.keep()
    g.compute()
    assert [s.ops for s in g.plan.steps] == [("rms_norm",), ("mul",)]  # a kept value is not fused away
    assert nmse(n.numpy(), ref_rms_norm(a, 1e-6)) < 1e-7
    assert nmse(y.numpy(), ref_rms_norm(a, 1e-6) * a) < 1e-7


def test_keep_of_a_tensor_outside_the_graph_is_an_error(rng):
    x = gg.tensor(f32(rng, 4))
    other = gg.silu(x)
    with pytest.raises(gg.GraphError, match="not part of the graph"):
        gg.build_forward(gg.scale(x, 2.0), keep=[other])


def test_an_output_before_any_compute(rng):
    y = gg.silu(gg.tensor(f32(rng, 4)))
    gg.build_forward(y, backends=CPU)
    with pytest.raises(gg.GraphError, match="no value yet"):
        y.numpy()


# ---- 2. graphs sharing nodes -----------------------------------------------------------------
def test_the_issue_example(rng):
    a = f32(rng, 6, 9)
    x = gg.tensor(a)
    h = gg.scale(x, 2.0)
    g1 = gg.build_forward(gg.silu(h), backends=CPU)
    y2 = gg.scale(h, 3.0)
    g2 = gg.build_forward(y2, backends=CPU)
    g1.compute()
    g2.compute()
    before = y2.numpy()
    g1.compute()
    assert np.array_equal(y2.numpy(), before)
    assert nmse(before, 6.0 * a) < 1e-7


def test_many_graphs_sharing_nodes_in_random_orders(rng):
    a = f32(rng, 4, 17)
    x = gg.tensor(a)
    h = gg.silu(gg.scale(x, 0.5))              # shared by every graph
    k = gg.rms_norm(h, 1e-6)                   # shared by some
    outs = [gg.scale(h, 2.0), gg.add(k, x), gg.soft_max(k), gg.mul(h, h), k]
    refs_of = lambda v: [2 * ref_silu(0.5 * v), ref_rms_norm(ref_silu(0.5 * v), 1e-6) + v,  # noqa: E731
                         ref_soft_max(ref_rms_norm(ref_silu(0.5 * v), 1e-6)), ref_silu(0.5 * v) ** 2,
                         ref_rms_norm(ref_silu(0.5 * v), 1e-6)]
    graphs = [gg.build_forward(o, backends=CPU, fuse=bool(i % 2)) for i, o in enumerate(outs)]
    computed_with = [None] * len(outs)  # the x each output was last computed from
    for _ in range(25):
        i = int(rng.integers(len(graphs)))
        if rng.random() < 0.3:
            a = f32(rng, 4, 17)
            x.set(a)
        graphs[i].compute()
        computed_with[i] = a.copy()
        for j, o in enumerate(outs):  # every output still holds what its own graph computed last
            if computed_with[j] is not None:
                assert nmse(o.numpy(), refs_of(computed_with[j])[j]) < 1e-6, (i, j)


def test_an_output_of_two_graphs_reads_the_last_compute(rng):
    a, b = f32(rng, 8), f32(rng, 8)
    x = gg.tensor(a)
    y = gg.silu(x)
    g1 = gg.build_forward(y, backends=CPU)
    g2 = gg.build_forward(gg.scale(y, 2.0), y, backends=CPU)
    g1.compute()
    x.set(b)
    g2.compute()
    assert nmse(y.numpy(), ref_silu(b)) < 1e-7
    x.set(a)
    g1.compute()
    assert nmse(y.numpy(), ref_silu(a)) < 1e-7


# ---- 3. reading a plan changes nothing ------------------------------------------------------------
def test_reading_a_cuda_plan_places_nothing(rng):
    a, w = f32(rng, 3, 16), f32(rng, 16)
    x, wt = gg.tensor(a), gg.tensor(w)
    y = gg.mul(x, wt)
    state = lambda: [(t.home, t.buffer, t.offset, t.flags) for t in (x, wt)]  # noqa: E731
    before = state()
    plan = gg.build_forward(y, backends=("cuda", "cpu")).plan  # never needs a GPU
    assert all(s.backend == "cuda" for s in plan.steps)
    assert state() == before
    z = gg.mul(x, wt)
    gg.build_forward(z, backends=CPU).compute()  # the leaves are still free to live on the CPU
    assert nmse(z.numpy(), a * w) < 1e-7
    assert x.home == "cpu"


def test_a_plan_made_before_its_leaves_were_placed_elsewhere(rng):
    import fake_backend  # noqa: F401  (registers "fake", a second host backend)
    a = f32(rng, 3, 16)
    x = gg.tensor(a)
    y1 = gg.silu(x)
    g1 = gg.build_forward(y1, backends=("fake", "cpu"))
    assert g1.plan.leaf_homes[x] == "fake"       # made while x is unplaced
    y2 = gg.scale(x, 2.0)
    gg.build_forward(y2, backends=CPU).compute()  # places x on the cpu
    g1.compute()                                  # re-plans: x now needs a transfer
    assert any(s.ops == ("transfer",) for s in g1.plan.steps)
    assert nmse(y1.numpy(), ref_silu(a)) < 1e-7
    assert x.home == "cpu"


# ---- 4. integers never wrap ---------------------------------------------------------------------
@pytest.mark.parametrize("value", [2**32 + 1, 3_000_000_000, -2**31 - 1])
def test_i32_values_are_range_checked(value):
    with pytest.raises(gg.ShapeError, match="does not fit"):
        gg.tensor(np.array([value]), dtype=gg.I32)
    p = gg.new_tensor(gg.I32, (2,))
    with pytest.raises(gg.ShapeError, match="does not fit"):
        p.set(np.array([0, value]))
    with pytest.raises(gg.ShapeError, match="does not fit"):
        p.set(np.array([0, value], dtype=np.int64))


def test_a_wrapped_row_index_can_not_reach_get_rows(rng):
    a = f32(rng, 7, 4)
    idx = gg.new_tensor(gg.I32, (1,))
    y = gg.get_rows(gg.tensor(a), idx)
    with pytest.raises(gg.ShapeError):
        idx.set(np.array([2**32 + 1]))  # would wrap to row 1
    idx.set(np.array([1]))
    gg.build_forward(y, backends=CPU).compute()
    assert np.array_equal(y.numpy().reshape(-1), ref_get_rows(a, np.array([1])).reshape(-1).astype(np.float32))


def test_i32_extremes_fit():
    t = gg.tensor(np.array([-2**31, 2**31 - 1], dtype=np.int64), dtype=gg.I32)
    assert t.numpy().tolist() == [-2**31, 2**31 - 1]


# ---- 5. careless arguments ---------------------------------------------------------------------
@pytest.mark.parametrize("ne,err", [((2.7, 3), gg.ShapeError), ((True, 3), gg.ShapeError), ("ab", gg.ShapeError),
                                    ((0, 3), gg.ShapeError), ((2**62, 16), gg.ShapeError),
                                    ((1, 2, 3, 4, 5), gg.ShapeError), (None, gg.ShapeError)])
def test_bad_ne(ne, err):
    with pytest.raises(err):
        gg.new_tensor(gg.F32, ne)


def test_ne_takes_ints_and_numpy_ints():
    assert gg.new_tensor(gg.F32, 5).ne == (5, 1, 1, 1)
    assert gg.new_tensor(gg.F32, (np.int64(3), np.int32(2))).ne == (3, 2, 1, 1)


def test_too_big_to_allocate_is_out_of_memory():
    with pytest.raises(gg.OutOfMemoryError):
        gg.new_tensor(gg.F32, (2**40, 2**10))


def test_backends_as_a_string_or_a_sequence(rng):
    x = gg.tensor(f32(rng, 4))
    for backends in ("cpu", ["cpu"], ("cpu",)):
        g = gg.build_forward(gg.silu(x), backends=backends)
        assert g.plan.backends == ("cpu",)
    for bad in ("c", ("cpu", 3), (), 7):
        with pytest.raises(gg.GGError):
            gg.build_forward(gg.silu(x), backends=bad).plan


@pytest.mark.parametrize("make", [
    lambda x: gg.scale(x, "2"), lambda x: gg.scale(x, True), lambda x: gg.scale(x, None),
    lambda x: gg.diag_mask_inf(x, True), lambda x: gg.diag_mask_inf(x, 1.5),
    lambda x: gg.rms_norm(x, "1e-6"), lambda x: gg.soft_max_ext(x, scale=False),
    lambda x: gg.view_1d(x, 2, offset=True), lambda x: gg.view_1d(x, 2, offset=4.0),
    lambda x: gg.permute(x, True, 0, 2, 3), lambda x: gg.view_1d(x, 2.0),
])
def test_op_params_are_type_checked(make, rng):
    x = gg.tensor(f32(rng, 4, 4))
    with pytest.raises(gg.GGError):
        make(x)


def test_empty_graph_compute_is_an_error():
    with pytest.raises(gg.GraphError, match="no outputs"):
        gg.Graph().compute()
    with pytest.raises(gg.GraphError, match="no outputs"):
        gg.Graph().plan


# ---- 6. no numpy warnings from defined specials ---------------------------------------------------
SPECIALS = np.array([[np.inf, -np.inf, np.nan, 0.0, 1.0, -3.0, 1e30, -1e30]], np.float32)


@pytest.mark.parametrize("make", [
    lambda t: gg.norm(t, 1e-5), lambda t: gg.rms_norm(t, 1e-6), gg.silu, gg.gelu, lambda t: gg.scale(t, 3.0),
    gg.soft_max, lambda t: gg.div(t, t), lambda t: gg.mul(t, t),
    lambda t: gg.rope(gg.reshape(t, 8, 1, 1), gg.tensor(np.array([3], np.int32)), 8),
])
def test_cpu_kernels_raise_no_warnings_on_specials(make):
    x = gg.tensor(SPECIALS)
    y = make(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gg.build_forward(y, backends=CPU).compute()
        y.numpy()


def test_a_pickled_or_copied_dtype_is_the_same_dtype():
    # gg compares dtypes by identity (`t.dtype is gg.F32`): a copy that is merely equal would make
    # backends refuse ops they support
    import copy
    import pickle
    for dt in gg.dtypes.ALL:
        assert pickle.loads(pickle.dumps(dt)) is dt
        assert copy.copy(dt) is dt and copy.deepcopy(dt) is dt
    with pytest.raises(ValueError, match="unknown gg dtype"):
        gg.dtypes.by_name("f8")
