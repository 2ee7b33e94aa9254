"""The tensor model (DESIGN §1, §3): ne/nb, numpy() shapes, dtype rules, set(), views, permute,
reshape, operators, freeing a context."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg.tensor import contiguous_strides

CPU = ("cpu",)


def compute(y):
    gg.build_forward(y, backends=CPU).compute()
    return y.numpy()


# ---- ne / nb -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,size", [(gg.F32, 4), (gg.F16, 2), (gg.BF16, 2), (gg.I32, 4)])
def test_contiguous_strides(dtype, size):
    ctx = gg.Context()
    t = ctx.new_tensor(dtype, (5, 3, 2))
    assert t.ne == (5, 3, 2, 1)
    assert t.nb == (size, 5 * size, 15 * size, 30 * size)
    assert t.is_contiguous() and t.nelements == 30 and t.dtype is dtype
    assert dtype.size == size
    assert t.op is None and t.src == () and t.view_src is None and t.view_offs == 0


@pytest.mark.parametrize("shape,ne,n_dims", [
    ((7,), (7, 1, 1, 1), 1),
    ((3, 7), (7, 3, 1, 1), 2),
    ((2, 3, 7), (7, 3, 2, 1), 3),
    ((4, 2, 3, 7), (7, 3, 2, 4), 4),
    ((1, 7), (7, 1, 1, 1), 1),          # leading numpy unit dim = trailing ne unit dim
    ((7, 1), (1, 7, 1, 1), 2),
    ((2, 1, 1, 7), (7, 1, 1, 2), 4),
    ((), (1, 1, 1, 1), 1),
])
def test_tensor_from_numpy_ne_and_numpy_shape(rng, shape, ne, n_dims):
    x = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    t = gg.Context().tensor(x)
    assert t.ne == ne
    assert t.n_dims == n_dims
    assert t.nb == contiguous_strides(gg.F32, ne)
    out = t.numpy()
    assert out.shape == ne[:n_dims][::-1]        # trailing unit dims of ne dropped
    assert out.shape == t.shape
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))


def test_numpy_returns_a_copy(rng):
    t = gg.Context().tensor(rng.standard_normal((3, 4)).astype(np.float32))
    a = t.numpy()
    a[...] = 7
    assert not np.any(t.numpy() == 7)


@pytest.mark.parametrize("np_dtype,gg_dtype", [(np.float32, gg.F32), (np.float16, gg.F16), (np.int32, gg.I32)])
def test_dtype_follows_array(rng, np_dtype, gg_dtype):
    x = (rng.standard_normal((2, 3)) * 100).astype(np_dtype)
    t = gg.tensor(x)
    assert t.dtype is gg_dtype
    out = t.numpy()
    assert out.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("np_dtype", [np.float64, np.int64, np.int8, np.bool_, np.complex64, np.uint16])
def test_other_array_dtypes_need_explicit_dtype(np_dtype):
    x = np.ones((2, 3), dtype=np_dtype)
    with pytest.raises(gg.DTypeError, match="tensor"):
        gg.tensor(x)


def test_float64_with_explicit_dtype(rng):
    x = rng.standard_normal((3, 5))
    t = gg.tensor(x, dtype=gg.F32)
    assert t.dtype is gg.F32
    np.testing.assert_array_equal(t.numpy(), x.astype(np.float32))
    h = gg.tensor(x, dtype=gg.F16)
    np.testing.assert_array_equal(h.numpy(), x.astype(np.float16))


def test_bf16_storage_and_readback(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    t = gg.tensor(x, dtype=gg.BF16)
    assert t.dtype is gg.BF16 and t.nb[0] == 2
    out = t.numpy()
    assert out.dtype == np.float32                       # BF16 reads back as float32
    assert np.all(np.abs(out - x) <= np.abs(x) * 2.0 ** -8)
    bits = out.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)                    # exactly representable in bf16


def test_float_into_i32_is_refused():
    with pytest.raises(gg.DTypeError):
        gg.tensor(np.ones(3, np.float32), dtype=gg.I32)
    with pytest.raises(gg.DTypeError):
        gg.Context().new_tensor(gg.I32, (3,)).set(np.ones(3, np.float32))


def test_new_tensor_zero_filled_and_flags():
    ctx = gg.Context()
    t = ctx.new_tensor(gg.F16, (4, 2), name="cache", persistent=True)
    assert t.name == "cache"
    assert gg.Flag.PERSISTENT in t.flags and gg.Flag.INPUT in t.flags
    np.testing.assert_array_equal(t.numpy(), np.zeros((2, 4), np.float16))
    with pytest.raises(gg.DTypeError):
        ctx.new_tensor(np.float32, (4,))
    with pytest.raises(gg.ShapeError):
        ctx.new_tensor(gg.F32, (4, 0))
    with pytest.raises(gg.ShapeError):
        ctx.new_tensor(gg.F32, (1, 2, 3, 4, 5))


# ---- set() ---------------------------------------------------------------------------------------

def test_set_roundtrip_and_leading_unit_dims(rng):
    t = gg.Context().new_tensor(gg.F32, (5, 3))
    x = rng.standard_normal((3, 5)).astype(np.float32)
    t.set(x)
    np.testing.assert_array_equal(t.numpy(), x)
    t.set(x[None, None] * 2)                            # leading unit dims don't matter
    np.testing.assert_array_equal(t.numpy(), x * 2)
    t.set(rng.standard_normal((3, 5)))                  # float64 data into an F32 tensor: converts
    assert t.numpy().dtype == np.float32


@pytest.mark.parametrize("bad", [(5, 3), (3, 4), (15,), (3, 5, 2), (2, 3, 5)])
def test_set_wrong_shape(rng, bad):
    t = gg.Context().new_tensor(gg.F32, (5, 3), name="w")
    with pytest.raises(gg.ShapeError, match=r"set.*'w'.*\(5, 3, 1, 1\)"):
        t.set(rng.standard_normal(bad).astype(np.float32))


def test_set_into_view_writes_only_the_view(rng):
    ctx = gg.Context()
    t = ctx.new_tensor(gg.F32, (6, 4))
    base = rng.standard_normal((4, 6)).astype(np.float32)
    t.set(base)
    v = gg.view_2d(t, 3, 2, t.nb[1] * 2, offset=t.nb[1] + 4)    # rows 1, 3; cols 1..3
    new = rng.standard_normal((2, 3)).astype(np.float32)
    v.set(new)
    want = base.copy()
    want[1:4:2, 1:4] = new
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(v.numpy(), new)


def test_set_on_an_op_result_is_refused(rng):
    a = gg.tensor(rng.standard_normal(4).astype(np.float32))
    with pytest.raises(gg.GGError, match="set"):
        gg.scale(a, 2.0).set(np.ones(4, np.float32))


def test_op_result_has_no_data_before_compute(rng):
    a = gg.tensor(rng.standard_normal(4).astype(np.float32))
    with pytest.raises(gg.GGError, match="is an intermediate"):
        gg.scale(a, 2.0).numpy()
    y = gg.scale(a, 2.0)
    gg.build_forward(gg.silu(y))  # an output, not computed yet
    with pytest.raises(gg.GGError, match="no value yet"):
        gg.silu(y).numpy() if False else gg.build_forward(y).outputs[0].numpy()


# ---- views, permute, reshape -------------------------------------------------------------------

def test_view_metadata(rng):
    t = gg.Context().tensor(rng.standard_normal((4, 3, 10)).astype(np.float32))   # ne (10, 3, 4)
    v1 = gg.view_1d(t, 7, offset=8)
    assert v1.ne == (7, 1, 1, 1) and v1.nb[0] == 4 and v1.view_src is t and v1.view_offs == 8
    v2 = gg.view_2d(t, 5, 6, 40, offset=12)
    assert v2.ne == (5, 6, 1, 1) and v2.nb[:2] == (4, 40)
    v3 = gg.view_3d(t, 5, 2, 4, 40, 120, 4)
    assert v3.ne == (5, 2, 4, 1) and v3.nb[:3] == (4, 40, 120)
    v4 = gg.view_4d(t, 2, 3, 2, 2, 40, 120, 240, 0)
    assert v4.ne == (2, 3, 2, 2) and v4.nb == (4, 40, 120, 240)
    # a view of a view records the root and the summed offset
    vv = gg.view_1d(v2, 3, offset=4)
    assert vv.view_src is t and vv.view_offs == 16
    assert all(v.op is not None for v in (v1, v2, v3, v4))


def test_view_data(rng):
    x = rng.standard_normal((4, 3, 10)).astype(np.float32)
    t = gg.Context().tensor(x)
    v = gg.view_3d(t, 5, 2, 3, 40, 120, 8)      # x[0:3, 0:2, 2:7]
    np.testing.assert_array_equal(v.numpy(), x[:3, :2, 2:7])
    np.testing.assert_array_equal(compute(gg.cont(v)), x[:3, :2, 2:7])


@pytest.mark.parametrize("axes", [(0, 1, 2, 3), (1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (1, 2, 0, 3),
                                  (3, 2, 1, 0), (2, 3, 0, 1)])
def test_permute_ggml_convention(rng, axes):
    x = rng.standard_normal((5, 4, 3, 2)).astype(np.float32)     # ne (2, 3, 4, 5)
    t = gg.Context().tensor(x)
    p = gg.permute(t, *axes)
    for i, ax in enumerate(axes):
        assert p.ne[ax] == t.ne[i] and p.nb[ax] == t.nb[i]       # source dim i goes to position ax_i
    assert p.view_src is t and p.view_offs == 0
    # numpy: ggml dim d is numpy axis 3-d, so numpy axis 3-ax_i comes from numpy axis 3-i
    perm = [0] * 4
    for i, ax in enumerate(axes):
        perm[3 - ax] = 3 - i
    want = np.transpose(x, perm)
    np.testing.assert_array_equal(p.numpy().reshape(want.shape), want)
    np.testing.assert_array_equal(compute(gg.cont(p)).reshape(want.shape), want)


def test_permute_is_not_numpy_transpose_convention(rng):
    t = gg.Context().tensor(rng.standard_normal((5, 4, 3, 2)).astype(np.float32))   # ne (2, 3, 4, 5)
    p = gg.permute(t, 1, 2, 0, 3)
    assert p.ne == (4, 2, 3, 5)          # ggml: ne[1]=a.ne[0], ne[2]=a.ne[1], ne[0]=a.ne[2]


def test_transpose(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    t = gg.Context().tensor(x)
    tt = gg.transpose(t)
    assert tt.ne == (3, 5, 1, 1) and tt.nb[:2] == (20, 4) and not tt.is_contiguous()
    np.testing.assert_array_equal(tt.numpy(), x.T)


def test_reshape(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    t = gg.Context().tensor(x)
    r = gg.reshape(t, 3, 8)
    assert r.ne == (3, 8, 1, 1) and r.is_contiguous() and r.view_src is t
    np.testing.assert_array_equal(r.numpy(), x.reshape(8, 3))
    assert gg.reshape(t, (2, 3, 4)).ne == (2, 3, 4, 1)
    np.testing.assert_array_equal(compute(gg.scale(gg.reshape(t, 24), 2.0)), x.reshape(-1) * 2)


def test_reshape_needs_contiguous(rng):
    t = gg.Context().tensor(rng.standard_normal((4, 6)).astype(np.float32))
    with pytest.raises(gg.ShapeError, match="reshape.*contiguous"):
        gg.reshape(gg.transpose(t), 24)
    r = gg.reshape(gg.cont(gg.transpose(t)), 24)       # fine after cont
    assert r.ne == (24, 1, 1, 1)
    with pytest.raises(gg.ShapeError, match="reshape"):
        gg.reshape(t, 5, 5)


@pytest.mark.parametrize("make", [
    lambda t: gg.view_1d(t, 25, 0),
    lambda t: gg.view_1d(t, 1, 96),
    lambda t: gg.view_1d(t, 4, 84),
    lambda t: gg.view_2d(t, 6, 5, 24, 0),
    lambda t: gg.view_2d(t, 6, 4, 24, 4),
    lambda t: gg.view_3d(t, 2, 2, 3, 8, 48, 0),
    lambda t: gg.view_4d(t, 6, 4, 1, 2, 24, 96, 96, 0),
], ids=["1d-long", "1d-offset-end", "1d-offset", "2d-rows", "2d-offset", "3d", "4d"])
def test_view_out_of_bounds_fails_at_build(make):
    t = gg.Context().new_tensor(gg.F32, (6, 4))     # 96 bytes
    with pytest.raises(gg.ShapeError, match=r"outside its source"):
        make(t)


def test_views_at_the_edge_are_fine():
    t = gg.Context().new_tensor(gg.F32, (6, 4))
    assert gg.view_1d(t, 24, 0).nelements == 24
    assert gg.view_1d(t, 1, 92).view_offs == 92
    assert gg.view_2d(t, 3, 4, 24, 12).ne == (3, 4, 1, 1)


# ---- operators -----------------------------------------------------------------------------------

def test_operators_build_ops(rng):
    ctx = gg.Context()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = (rng.random(4) + 0.5).astype(np.float32)
    a, b = ctx.tensor(x), ctx.tensor(w)
    for y, op, want in ((a + b, "add", x + w), (a - b, "sub", x - w), (a * b, "mul", x * w),
                        (a / b, "div", x / w)):
        assert y.op == op and y.src == (a, b)
        np.testing.assert_allclose(compute(y), want, rtol=1e-6)


def test_tensors_are_identity_hashed(rng):
    ctx = gg.Context()
    a = ctx.tensor(np.ones(3, np.float32))
    b = ctx.tensor(np.ones(3, np.float32))
    assert a != b and a == a and len({a, b, a}) == 2


# ---- context free ------------------------------------------------------------------------------

def test_context_free(rng):
    ctx = gg.Context()
    a = ctx.tensor(rng.standard_normal(4).astype(np.float32), name="a")
    y = gg.scale(a, 2.0)
    ctx.free()
    with pytest.raises(gg.GGError):
        a.numpy()
    with pytest.raises(gg.GGError):
        ctx.new_tensor(gg.F32, (4,))
    with pytest.raises(gg.GGError):
        ctx.tensor(np.ones(3, np.float32))
    with pytest.raises(gg.GraphError, match="freed"):
        gg.build_forward(y, backends=CPU).compute()
    # other contexts are unaffected
    other = gg.Context().tensor(np.ones(3, np.float32))
    np.testing.assert_array_equal(compute(gg.scale(other, 2.0)), np.full(3, 2, np.float32))


def test_unit_dims_do_not_break_contiguity(rng):
    """ggml_is_contiguous ignores the strides of dims with ne == 1: the decode-time q permute
    (head_dim, n_head, 1) -> (head_dim, 1, n_head) is still contiguous memory and may be reshaped."""
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)            # ne (8, 4, 1): one token
    t = gg.Context().tensor(x)
    p = gg.permute(t, 0, 2, 1, 3)                                     # ne (8, 1, 4)
    assert p.ne == (8, 1, 4, 1) and p.nb != contiguous_strides(gg.F32, p.ne)
    assert p.is_contiguous()
    r = gg.reshape(p, 8, 4)
    np.testing.assert_array_equal(r.numpy(), x.reshape(4, 8))
    np.testing.assert_array_equal(compute(gg.scale(r, 2.0)), x.reshape(4, 8) * 2)
    v = gg.transpose(gg.Context().tensor(x.reshape(1, 32)))          # ne (1, 32): a column
    assert v.is_contiguous()
    np.testing.assert_array_equal(gg.reshape(v, 32).numpy(), x.reshape(-1))
    # but a real gap is not contiguous
    assert not gg.permute(t, 1, 0, 2, 3).is_contiguous()
    assert not gg.view_2d(t, 4, 4, 32, 0).is_contiguous()
