"""The CPU backend's op functions: numpy, float32 results (float64 inside reductions).

Each function takes the node and its sources as numpy arrays in numpy order (shape ne[::-1]; float
sources already decoded to float32) and returns the node's values in the same order."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...errors import BackendError
from ...ops import ROPE_NEOX
from ...tensor import Tensor

KERNELS: dict[str, Callable[..., np.ndarray]] = {}
# Ops whose kernel gets the destination's raw (encoded, writable) view and writes only what changes.
WRITES_IN_PLACE = {"set_rows"}


def kernel(*names: str):
    def deco(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return deco


def repeat_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml broadcast: b repeats over a (each dim of a a multiple of b's)."""
    if b.shape == shape:
        return b
    return np.tile(b, tuple(s // t for s, t in zip(shape, b.shape)))


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@kernel("add", "sub", "mul", "div")
def binary(node: Tensor, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert node.op is not None  # a computed node
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _BINARY[node.op](a, repeat_to(b, a.shape)).astype(np.float32)


@kernel("scale")
def scale(node: Tensor, a: np.ndarray) -> np.ndarray:
    return a * np.float32(node.params.s)


@kernel("silu")
def silu(node: Tensor, a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (a / (1.0 + np.exp(-a.astype(np.float64)))).astype(np.float32)


@kernel("gelu")
def gelu(node: Tensor, a: np.ndarray) -> np.ndarray:
    x = a.astype(np.float64)
    return (0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))).astype(np.float32)


@kernel("rms_norm")
def rms_norm(node: Tensor, a: np.ndarray) -> np.ndarray:
    x = a.astype(np.float64)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + node.params.eps)).astype(np.float32)


@kernel("norm")
def norm(node: Tensor, a: np.ndarray) -> np.ndarray:
    x = a.astype(np.float64)
    x = x - x.mean(axis=-1, keepdims=True)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + node.params.eps)).astype(np.float32)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's ALiBi slope per head (dim 2)."""
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-max_bias / 2.0 / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))


@kernel("soft_max")
def soft_max(node: Tensor, a: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    p = node.params
    x = a.astype(np.float64) * p.scale
    if mask is not None:
        m = repeat_to(mask[:, :, :a.shape[2], :].astype(np.float64), x.shape)
        if p.max_bias > 0:
            m = m * alibi_slopes(a.shape[1], p.max_bias)[None, :, None, None]
        x = x + m
    mx = np.max(x, axis=-1, keepdims=True)
    masked = mx == -np.inf  # a fully masked row gives zeros (not NaN); NaN inputs still propagate
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - np.where(masked, 0.0, mx))
        y = np.where(masked, 0.0, e / np.where(masked, 1.0, e.sum(axis=-1, keepdims=True)))
    return y.astype(np.float32)


@kernel("diag_mask_inf")
def diag_mask_inf(node: Tensor, a: np.ndarray) -> np.ndarray:
    rows, cols = a.shape[-2], a.shape[-1]
    masked = np.arange(cols)[None, :] > node.params.n_past + np.arange(rows)[:, None]
    return np.where(masked, np.float32(-np.inf), a).astype(np.float32)


@kernel("rope")
def rope(node: Tensor, a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    p = node.params
    half = p.n_dims // 2
    theta = (pos.reshape(-1).astype(np.float64)[:, None] * p.freq_scale
             * p.freq_base ** (-2.0 * np.arange(half) / p.n_dims))          # (T, half)
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    x = a.astype(np.float64)
    out = x.copy()
    if p.mode == ROPE_NEOX:
        x0, x1 = x[..., :half], x[..., half:p.n_dims]
        out[..., :half], out[..., half:p.n_dims] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:p.n_dims:2], x[..., 1:p.n_dims:2]
        out[..., 0:p.n_dims:2], out[..., 1:p.n_dims:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out.astype(np.float32)


@kernel("mul_mat")
def mul_mat(node: Tensor, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.repeat(np.repeat(a, b.shape[0] // a.shape[0], axis=0), b.shape[1] // a.shape[1], axis=1)
    return np.matmul(b, np.swapaxes(a, -1, -2), dtype=np.float32)


def _check_rows(op: str, idx: np.ndarray, n_rows: int) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise BackendError(f"{op}: row index out of range [0, {n_rows}): min {idx.min()}, max {idx.max()}")


@kernel("get_rows")
def get_rows(node: Tensor, a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    _check_rows("get_rows", idx, a.shape[2])
    idx = idx[0]  # (a3, a2, n)
    out = np.take_along_axis(a, idx[..., None].astype(np.int64), axis=2)
    return out


@kernel("set_rows")
def set_rows(node: Tensor, dst: np.ndarray, b: np.ndarray, idx: np.ndarray) -> None:
    """Writes the rows straight into dst's raw storage (see WRITES_IN_PLACE): a KV-cache write must
    not cost a pass over the whole cache."""
    from ...dtypes import encode
    _check_rows("set_rows", idx, dst.shape[2])
    c = idx[0]  # (c2, c1, n)
    for i3 in range(b.shape[0]):
        for i2 in range(b.shape[1]):
            dst[i3, i2, c[i3 % c.shape[0], i2 % c.shape[1]]] = encode(b[i3, i2], node.dtype)


@kernel("cpy")
def cpy(node: Tensor, a: np.ndarray, dst: np.ndarray) -> np.ndarray:
    return a.reshape(dst.shape)


@kernel("cont", "cast", "transfer")
def copy(node: Tensor, a: np.ndarray) -> np.ndarray:
    return a


@kernel("argmax")
def argmax(node: Tensor, a: np.ndarray) -> np.ndarray:
    """Row maxima's first index; np.argmax lets a NaN win, as the op's contract says."""
    return np.argmax(a, axis=-1).astype(np.int32)[..., None]
