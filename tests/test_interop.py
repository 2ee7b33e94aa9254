"""DLPack and the CUDA array interface, both ways and without copies: numpy on the CPU (here and in
CI), torch and CuPy on the GPU machine (`pytest -m cuda`)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import gg
from gg import interop
from reference import nmse, ref_rms_norm, ref_silu

CPU = ("cpu",)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- numpy (CPU) -----------------------------------------------------------------------------
def test_numpy_in_aliases_and_updates_between_computes(rng):
    a = f32(rng, 3, 40)
    x = gg.from_dlpack(a, name="x")
    assert x.ne == (40, 3, 1, 1) and x.is_leaf
    y = gg.silu(x)
    g = gg.build_forward(y, backends=CPU)
    g.compute()
    assert nmse(y.numpy(), ref_silu(a)) < 1e-7
    a *= 3  # in place, on numpy's side: the next compute reads it
    g.compute()
    assert nmse(y.numpy(), ref_silu(a)) < 1e-7
    x.set(np.ones_like(a))  # and gg's writes land in numpy's array
    assert np.array_equal(a, np.ones_like(a))


@pytest.mark.parametrize("make", [
    lambda b: b[::2, 1::3], lambda b: b.T, lambda b: b[1:, :5],
    lambda b: np.broadcast_to(b[0], (4, b.shape[1])),
])
def test_numpy_strided_producers(make, rng):
    base = f32(rng, 6, 9)
    s = make(base)
    t = gg.from_dlpack(s)
    c = gg.cont(t)
    gg.build_forward(c, backends=CPU).compute()
    assert np.array_equal(c.numpy(), s)
    assert np.array_equal(np.from_dlpack(t), s)  # and back out, with the same strides


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_numpy_dtypes_round_trip(dtype, rng):
    a = (rng.standard_normal((5, 7)) * 10).astype(dtype)
    t = gg.from_dlpack(a)
    assert t.dtype is {np.float32: gg.F32, np.float16: gg.F16, np.int32: gg.I32}[dtype]
    assert np.array_equal(np.from_dlpack(t), a)


def test_output_out_without_a_copy(rng):
    a = f32(rng, 4, 64)
    y = gg.rms_norm(gg.tensor(a), 1e-6)
    g = gg.build_forward(y, backends=CPU)
    g.compute()
    out = np.from_dlpack(y)
    assert nmse(out, ref_rms_norm(a, 1e-6)) < 1e-7
    assert y.__dlpack_device__() == (interop.DL_CPU, 0)
    assert not hasattr(y, "__cuda_array_interface__")  # a CPU value is not a CUDA array
    g.compute()
    assert np.shares_memory(out, np.from_dlpack(y))  # the same output buffer each compute


def test_export_keeps_the_memory_alive(rng):
    a = f32(rng, 16)
    out = np.from_dlpack(gg.tensor(a))  # the gg leaf dies here; its storage must not
    gc.collect()
    assert np.array_equal(out, a)
    capsule = gg.tensor(a).__dlpack__()  # a capsule never consumed frees what it held
    n = len(interop._exported)
    del capsule
    gc.collect()
    assert len(interop._exported) == n - 1


def test_refusals(rng):
    with pytest.raises(gg.DTypeError, match="DLPack producer"):
        gg.from_dlpack([1.0, 2.0])
    with pytest.raises(gg.DTypeError):
        gg.from_dlpack(np.ones(4, np.float64))  # no gg dtype: a clear error, not a silent cast
    with pytest.raises(gg.ShapeError, match="negative strides"):
        gg.from_dlpack(np.arange(8, dtype=np.float32)[::-1])
    with pytest.raises(gg.ShapeError, match="at most 4"):
        gg.from_dlpack(np.ones((1, 2, 1, 2, 2), np.float32))
    y = gg.silu(gg.tensor(f32(rng, 4)))
    with pytest.raises(gg.GraphError, match="intermediate|no value"):
        np.from_dlpack(y)  # nothing computed: nothing to export
    with pytest.raises(gg.BackendError, match="copy"):
        gg.tensor(f32(rng, 4)).__dlpack__(copy=True)


# ---- torch and CuPy (GPU) --------------------------------------------------------------------
@pytest.mark.cuda
def test_torch_in_and_out_on_the_gpu(rng):
    torch = pytest.importorskip("torch")
    a = torch.from_numpy(f32(rng, 8, 96)).cuda()
    x = gg.from_dlpack(a, name="x")
    assert x.dtype is gg.F32 and x.home == "cuda"
    y = gg.rms_norm(x, 1e-6)
    g = gg.build_forward(y, backends=("cuda",))
    for k in range(3):  # torch updates the input in place between computes
        a.mul_(1.5 if k else 1.0).add_(0.25)
        torch.cuda.current_stream().synchronize()
        g.compute()
        out = torch.from_dlpack(y)
        assert out.device.type == "cuda"
        assert nmse(out.cpu().numpy(), ref_rms_norm(a.cpu().numpy(), 1e-6)) < 1e-7
    assert out.data_ptr() == g.locate(y)[0].ptr + g.locate(y)[1]  # zero-copy: gg's own bytes


@pytest.mark.cuda
def test_torch_strided_and_half_inputs(rng):
    torch = pytest.importorskip("torch")
    base = torch.from_numpy(f32(rng, 12, 33)).cuda()
    t = base.t()[:, ::2].half()[::3]  # a strided F16 view
    x = gg.from_dlpack(t)
    c = gg.cont(x)
    gg.build_forward(c, backends=("cuda",)).compute()
    assert np.array_equal(c.numpy(), t.cpu().numpy())
    with pytest.raises(gg.DTypeError):
        gg.from_dlpack(torch.ones(4, dtype=torch.float64, device="cuda"))


@pytest.mark.cuda
def test_cupy_in_and_out(rng):
    cp = pytest.importorskip("cupy")
    a = cp.asarray(f32(rng, 5, 64))
    x = gg.from_dlpack(a)
    y = gg.silu(x)
    g = gg.build_forward(y, backends=("cuda",))
    g.compute()
    out = cp.asarray(y)  # through __cuda_array_interface__
    assert out.data.ptr == g.locate(y)[0].ptr + g.locate(y)[1]
    assert nmse(cp.asnumpy(out), ref_silu(cp.asnumpy(a))) < 1e-7
    out2 = cp.from_dlpack(y)  # and through DLPack
    assert nmse(cp.asnumpy(out2), ref_silu(cp.asnumpy(a))) < 1e-7
