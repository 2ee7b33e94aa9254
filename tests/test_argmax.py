"""argmax over dim 0 (greedy decoding's token id): numpy's rules (first index on ties, NaN wins) on
the CPU and CUDA, odd sizes, F16/BF16 sources, strided views."""
from __future__ import annotations

import numpy as np
import pytest

import gg


def _rows(rng, n, rows):
    a = rng.standard_normal((rows, n)).astype(np.float32)
    a[0, n // 3] = a[0, n - 1] = 9.0          # a tie: the first wins
    if rows > 1:
        a[1, n // 2] = np.nan                  # a NaN wins
    if rows > 2:
        a[2, :] = -np.inf                      # all -inf: index 0
    return a


def _check(backends, rng, n, rows, dtype):
    a = _rows(rng, n, rows)
    x = gg.tensor(a.astype(dtype)) if dtype is not np.float32 else gg.tensor(a)
    y = gg.argmax(x)
    gg.build_forward(y, backends=backends).compute()
    want = np.argmax(a.astype(dtype).astype(np.float32), axis=-1)
    assert y.dtype is gg.I32 and y.ne == (1, rows, 1, 1)
    assert np.array_equal(y.numpy().reshape(-1), want)


@pytest.mark.parametrize("n,rows", [(1, 1), (5, 3), (1025, 4), (49152, 2)])
def test_argmax_cpu(n, rows, rng):
    _check(("cpu",), rng, n, rows, np.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n,rows", [(1, 1), (5, 3), (33, 7), (4, 3), (36, 5), (1025, 4), (1028, 3), (49152, 2),
                                    (128256, 1)])
def test_argmax_cuda(n, rows, dtype, rng):
    _check(("cuda",), rng, n, rows, dtype)


@pytest.mark.cuda
def test_argmax_cuda_of_a_transposed_view(rng):
    a = _rows(rng, 37, 5)
    y = gg.argmax(gg.transpose(gg.tensor(np.ascontiguousarray(a.T))))
    g = gg.build_forward(y, backends=("cuda",))
    assert g.plan.steps[0].kernel == "argmax_f32"
    g.compute()
    assert np.array_equal(y.numpy().reshape(-1), np.argmax(a, axis=-1))


@pytest.mark.parametrize("n,want,cluster", [(49152, "argmax_cl_vec_f32", 8), (4100, "argmax_cl_vec_f32", 2),
                                            (4096, "argmax_vec_f32", 0), (1028, "argmax_vec_f32", 0),
                                            (1025, "argmax_f32", 0)])
def test_argmax_cuda_plan_takes_the_vector_build_on_aligned_rows(n, want, cluster):
    """Rows of more than 1024 runs of 4 take up to reduce.CLUSTER blocks (one cluster on sm_90+)."""
    y = gg.argmax(gg.tensor(np.ones((2, n), np.float32)))
    g = gg.build_forward(y, backends=("cuda", "cpu"))
    assert g.plan.steps[0].kernel == want and g.plan.steps[0].choice.cluster == cluster


@pytest.mark.cuda
@pytest.mark.parametrize("n,rows", [(4100, 3), (49152, 2), (128256, 1), (8196, 5)])
def test_argmax_cuda_in_a_cluster_equals_one_block(n, rows, rng, monkeypatch):
    """The row split over a cluster's blocks: the winner in any slice, ties and NaN across slices
    (the first wins), a slice with nothing better than -inf; the same ids as one block a row."""
    from gg.backends.cuda.families import reduce
    a = rng.standard_normal((rows, n)).astype(np.float32)
    a[0, n - 3] = 50.0                       # the last slice wins
    if rows > 1:
        a[1, 5] = a[1, n - 1] = 60.0         # a tie across the first and the last slice
    if rows > 2:
        a[2, :] = -np.inf                    # every slice holds only -inf: index 0
        a[2, n // 2 + 1] = np.nan            # ... but a NaN in a middle slice wins
    if rows > 3:
        a[3, n - 2] = a[3, 7] = np.nan       # two NaNs in different slices: the first
    got = []
    for c in (reduce.CLUSTER, 0):
        monkeypatch.setattr(reduce, "CLUSTER", c)
        y = gg.argmax(gg.tensor(a))
        g = gg.build_forward(y, backends=("cuda",))
        assert (g.plan.steps[0].choice.cluster > 1) == (c > 0)
        g.compute()
        got.append(y.numpy().reshape(-1))
    assert np.array_equal(got[0], np.argmax(a, axis=-1)) and np.array_equal(got[0], got[1])
