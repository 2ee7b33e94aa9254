"""Every bad input of DESIGN §2 raises a gg.GGError subclass (ShapeError / DTypeError) whose message
names the op and the offending ne / dtype; index errors at compute time are GGErrors too."""
from __future__ import annotations

import re

import numpy as np
import pytest

import gg

CPU = ("cpu",)


def ne(t) -> str:
    return re.escape(str(t.ne))


def expect(exc, fn, *fragments):
    """fn() raises exc (a GGError subclass) and the message contains every fragment (regex)."""
    assert issubclass(exc, gg.GGError)
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, gg.GGError)
    for f in fragments:
        assert re.search(f, msg), f"{f!r} not in message: {msg}"
    return msg


@pytest.fixture
def ctx():
    return gg.Context()


def t(ctx, *ne_, dtype=gg.F32):
    x = ctx.new_tensor(dtype, ne_)
    if dtype is not gg.I32:
        x.set(np.full(x.ne[::-1], 0.5, np.float32))
    return x


# ---- binary ops -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("na,nb", [((6, 4), (4, 4)), ((3,), (6,)), ((4, 6), (4, 4)), ((4, 3, 2), (4, 3, 4)),
                                   ((4, 2, 2, 3), (4, 1, 1, 2))])
def test_binary_broadcast_mismatch(ctx, op, na, nb):
    a, b = t(ctx, *na), t(ctx, *nb)
    expect(gg.ShapeError, lambda: getattr(gg, op)(a, b), op, ne(a), ne(b))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_operator_mismatch(ctx, op):
    a, b = t(ctx, 5), t(ctx, 3)
    sym = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "div": "__truediv__"}[op]
    expect(gg.ShapeError, lambda: getattr(a, sym)(b), op, ne(a), ne(b))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_bad_dtypes_and_args(ctx, op):
    f, i = t(ctx, 4), t(ctx, 4, dtype=gg.I32)
    expect(gg.DTypeError, lambda: getattr(gg, op)(i, f), op, "i32")
    expect(gg.DTypeError, lambda: getattr(gg, op)(f, i), op, "i32")
    expect(gg.DTypeError, lambda: getattr(gg, op)(f, 2.0), op)
    expect(gg.DTypeError, lambda: getattr(gg, op)(np.ones(4, np.float32), f), op)


# ---- unary / scale / norms ---------------------------------------------------------------------

@pytest.mark.parametrize("build", [gg.silu, gg.gelu, lambda a: gg.scale(a, 2.0), lambda a: gg.rms_norm(a, 1e-6),
                                   lambda a: gg.norm(a, 1e-5), gg.soft_max, lambda a: gg.diag_mask_inf(a, 0)],
                         ids=["silu", "gelu", "scale", "rms_norm", "norm", "soft_max", "diag_mask_inf"])
def test_i32_input_refused(ctx, build):
    i = t(ctx, 4, 3, dtype=gg.I32)
    expect(gg.DTypeError, lambda: build(i), "i32", ne(i))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "x", None])
def test_scale_needs_a_finite_number(ctx, bad):
    a = t(ctx, 4)
    expect(gg.GGError, lambda: gg.scale(a, bad), "scale")


@pytest.mark.parametrize("op", ["rms_norm", "norm"])
@pytest.mark.parametrize("eps", [-1e-6, float("nan")])
def test_norm_bad_eps(ctx, op, eps):
    expect(gg.GGError, lambda: getattr(gg, op)(t(ctx, 4), eps), op, "eps")


# ---- mul_mat ---------------------------------------------------------------------------------------

def test_mul_mat_k_mismatch(ctx):
    a, b = t(ctx, 8, 5), t(ctx, 7, 3)
    expect(gg.ShapeError, lambda: gg.mul_mat(a, b), "mul_mat", ne(a), ne(b))
    expect(gg.ShapeError, lambda: b @ a, "mul_mat")


@pytest.mark.parametrize("na,nb", [((8, 5, 4), (8, 3, 6)),       # 6 heads over 4 kv heads
                                   ((8, 5, 3), (8, 3, 1)),       # a has more heads than b
                                   ((8, 5, 1, 2), (8, 3, 1, 3))])
def test_mul_mat_bad_gqa_ratio(ctx, na, nb):
    a, b = t(ctx, *na), t(ctx, *nb)
    expect(gg.ShapeError, lambda: gg.mul_mat(a, b), "mul_mat", ne(a), ne(b))


def test_mul_mat_bad_dtype(ctx):
    a, b = t(ctx, 8, 5, dtype=gg.I32), t(ctx, 8, 3)
    expect(gg.DTypeError, lambda: gg.mul_mat(a, b), "mul_mat", "i32")
    expect(gg.DTypeError, lambda: gg.mul_mat(b, a), "mul_mat", "i32")


# ---- rope -------------------------------------------------------------------------------------------

def _pos(ctx, n, dtype=gg.I32):
    p = ctx.new_tensor(dtype, (n,))
    return p


def test_rope_pos_length(ctx):
    a = t(ctx, 8, 2, 5)
    p = _pos(ctx, 4)
    expect(gg.ShapeError, lambda: gg.rope(a, p, 8), "rope", ne(p), ne(a))
    p2 = ctx.new_tensor(gg.I32, (5, 2))
    expect(gg.ShapeError, lambda: gg.rope(a, p2, 8), "rope", ne(p2))


@pytest.mark.parametrize("dt", [gg.F32, gg.F16])
def test_rope_pos_dtype(ctx, dt):
    a = t(ctx, 8, 2, 5)
    p = _pos(ctx, 5, dt)
    expect(gg.DTypeError, lambda: gg.rope(a, p, 8), "rope", "pos", dt.name)


@pytest.mark.parametrize("n_dims", [3, 7, 0, -2, 10, 2.5])
def test_rope_bad_n_dims(ctx, n_dims):
    a = t(ctx, 8, 2, 5)
    err = gg.ShapeError if isinstance(n_dims, int) else gg.DTypeError  # 2.5 is not an integer
    expect(err, lambda: gg.rope(a, _pos(ctx, 5), n_dims), "rope", "n_dims")


def test_rope_bad_mode_and_base(ctx):
    a = t(ctx, 8, 2, 5)
    expect(gg.ShapeError, lambda: gg.rope(a, _pos(ctx, 5), 8, mode=1), "rope", "mode")
    expect(gg.ShapeError, lambda: gg.rope(a, _pos(ctx, 5), 8, freq_base=0.0), "rope", "freq_base")
    expect(gg.DTypeError, lambda: gg.rope(t(ctx, 8, 2, 5, dtype=gg.I32), _pos(ctx, 5), 8), "rope", "i32")


# ---- softmax --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mne", [(9, 4), (8, 3), (8, 4, 4), (8, 4, 1, 2), (4, 8)],
                         ids=["ne0", "too-few-rows", "ne2", "ne3", "transposed"])
def test_soft_max_mask_shape(ctx, mne):
    a = t(ctx, 8, 4, 6)
    m = t(ctx, *mne)
    expect(gg.ShapeError, lambda: gg.soft_max_ext(a, m), "soft_max", ne(m), ne(a))


def test_soft_max_mask_dtype_and_alibi(ctx):
    a = t(ctx, 8, 4)
    m = t(ctx, 8, 4, dtype=gg.I32)
    expect(gg.DTypeError, lambda: gg.soft_max_ext(a, m), "soft_max", "mask", "i32")
    expect(gg.ShapeError, lambda: gg.soft_max_ext(a, None, max_bias=8.0), "soft_max", "max_bias")
    expect(gg.ShapeError, lambda: gg.soft_max_ext(a, t(ctx, 8, 4), max_bias=-1.0), "soft_max", "max_bias")


def test_soft_max_mask_strided_rows(ctx):
    a = t(ctx, 4, 4)
    m = gg.transpose(t(ctx, 4, 4))
    expect(gg.ShapeError, lambda: gg.soft_max_ext(a, m), "soft_max", "mask")


@pytest.mark.parametrize("n_past", [-1, 1.5])
def test_diag_mask_bad_n_past(ctx, n_past):
    err = gg.ShapeError if isinstance(n_past, int) else gg.DTypeError
    expect(err, lambda: gg.diag_mask_inf(t(ctx, 4, 4), n_past), "diag_mask_inf", "n_past")


# ---- copies, views, reshape ------------------------------------------------------------------------

def test_cpy_element_count(ctx):
    a, b = t(ctx, 6, 4), t(ctx, 5, 5)
    expect(gg.ShapeError, lambda: gg.cpy(a, b), "cpy", ne(a), ne(b))


def test_cpy_and_cast_float_int(ctx):
    f, i = t(ctx, 4), t(ctx, 4, dtype=gg.I32)
    expect(gg.DTypeError, lambda: gg.cpy(f, i), "cpy", "f32", "i32")
    expect(gg.DTypeError, lambda: gg.cpy(i, f), "cpy", "i32", "f32")
    expect(gg.DTypeError, lambda: gg.cast(f, gg.I32), "cast", "i32")
    expect(gg.DTypeError, lambda: gg.cast(f, np.float16), "cast")


def test_reshape_non_contiguous(ctx):
    a = gg.transpose(t(ctx, 4, 6))
    expect(gg.ShapeError, lambda: gg.reshape(a, 24), "reshape", ne(a), "contiguous")
    expect(gg.ShapeError, lambda: gg.reshape(t(ctx, 4, 6), 5, 5), "reshape", re.escape("(5, 5, 1, 1)"))


def test_view_out_of_bounds(ctx):
    a = t(ctx, 6, 4)
    expect(gg.ShapeError, lambda: gg.view_2d(a, 6, 4, 24, 4), "view", ne(a), "outside")
    expect(gg.ShapeError, lambda: gg.view_1d(a, 4, -4), "view", "offset")
    expect(gg.ShapeError, lambda: gg.permute(a, 0, 0, 1, 2), "permute", "axes")


# ---- get_rows / set_rows ------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [gg.F32, gg.F16])
def test_get_rows_index_dtype(ctx, dt):
    a = t(ctx, 4, 10)
    idx = ctx.new_tensor(dt, (3,))
    expect(gg.DTypeError, lambda: gg.get_rows(a, idx), "get_rows", "idx", dt.name)


def test_get_rows_index_shape(ctx):
    a = t(ctx, 4, 10, 3)
    idx = ctx.new_tensor(gg.I32, (2, 2))
    expect(gg.ShapeError, lambda: gg.get_rows(a, idx), "get_rows", ne(idx), ne(a))


def test_set_rows_bad_inputs(ctx):
    dst, src = t(ctx, 4, 10), t(ctx, 4, 3)
    idx_f = ctx.new_tensor(gg.F32, (3,))
    expect(gg.DTypeError, lambda: gg.set_rows(dst, src, idx_f), "set_rows", "idx", "f32")
    idx2 = ctx.new_tensor(gg.I32, (2,))
    expect(gg.ShapeError, lambda: gg.set_rows(dst, src, idx2), "set_rows", ne(idx2), ne(src))
    wide = t(ctx, 5, 3)
    expect(gg.ShapeError, lambda: gg.set_rows(dst, wide, ctx.new_tensor(gg.I32, (3,))), "set_rows", ne(wide))


@pytest.mark.parametrize("bad", [10, -1, 2 ** 31 - 1])
def test_get_rows_index_out_of_range_at_compute(ctx, bad):
    a = t(ctx, 4, 10)
    idx = ctx.tensor(np.array([0, bad, 3], np.int32))
    y = gg.get_rows(a, idx)
    g = gg.build_forward(y, backends=CPU)
    expect(gg.GGError, g.compute, "get_rows", "range")


@pytest.mark.parametrize("bad", [10, -1])
def test_set_rows_index_out_of_range_at_compute(ctx, rng, bad):
    dst = ctx.new_tensor(gg.F32, (4, 10), persistent=True)
    before = rng.standard_normal((10, 4)).astype(np.float32)
    dst.set(before)
    idx = ctx.tensor(np.array([1, bad], np.int32))
    g = gg.build_forward(gg.set_rows(dst, ctx.tensor(np.ones((2, 4), np.float32)), idx), backends=CPU)
    expect(gg.GGError, g.compute, "set_rows", "range")
    np.testing.assert_array_equal(dst.numpy(), before)   # no partial write of garbage


# ---- set() and tensor() --------------------------------------------------------------------------

def test_set_wrong_shape_names_the_tensor(ctx):
    w = ctx.new_tensor(gg.F32, (8, 2), name="w")
    expect(gg.ShapeError, lambda: w.set(np.ones((8, 2), np.float32)), "set", "'w'", re.escape("(8, 2, 1, 1)"),
           re.escape("(8, 2)"))


def test_set_wrong_dtype(ctx):
    expect(gg.DTypeError, lambda: ctx.new_tensor(gg.F32, (3,)).set(np.array(["a", "b", "c"])), "set")
    expect(gg.DTypeError, lambda: ctx.new_tensor(gg.I32, (3,)).set(np.ones(3)), "set", "i32")


def test_tensor_float64_without_dtype():
    expect(gg.DTypeError, lambda: gg.tensor(np.ones(3)), "tensor", "float64", "dtype=")


def test_errors_are_the_documented_classes():
    assert issubclass(gg.ShapeError, gg.GGError) and issubclass(gg.DTypeError, gg.GGError)
    assert issubclass(gg.GraphError, gg.GGError) and issubclass(gg.BackendError, gg.GGError)


@pytest.mark.parametrize("make", [
    lambda a: gg.view_1d(a, 2, 3),
    lambda a: gg.view_2d(a, 2, 2, 6, 0),
    lambda a: gg.view_3d(a, 2, 2, 1, 8, 10, 0),
    lambda a: gg.view_4d(a, 1, 1, 1, 2, 4, 4, 2, 0),
], ids=["offset", "nb1", "nb2", "nb3"])
def test_misaligned_view(ctx, make):
    """A byte offset or stride that is not a multiple of the element size would read torn elements
    (garbage on the CPU, a misaligned-address fault on a GPU): refused at build time."""
    a = t(ctx, 8)
    expect(gg.ShapeError, lambda: make(a), "view", ne(a), "element size")


def test_tensor_more_than_4_dims():
    expect(gg.ShapeError, lambda: gg.tensor(np.ones((1, 1, 1, 1, 2), np.float32)), "tensor", "4 dims")
