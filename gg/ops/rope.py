"""Rotary position embedding (ggml_rope_ext's NORMAL and NEOX modes)."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import F16, F32, I32
from ..errors import ShapeError
from ..tensor import Tensor
from ._check import dtype_in, finite_number, integer, tensor_arg
from .registry import register

ROPE_NORMAL = 0  # rotate pairs (x[2i], x[2i+1])
ROPE_NEOX = 2    # rotate (x[i], x[i + n_dims/2])

register("rope")


@dataclass(frozen=True)
class RopeParams:
    n_dims: int
    mode: int = ROPE_NORMAL
    freq_base: float = 10000.0
    freq_scale: float = 1.0


def rope(a: Tensor, pos: Tensor, n_dims: int, mode: int = ROPE_NORMAL, freq_base: float = 10000.0,
         freq_scale: float = 1.0) -> Tensor:
    """Rotate a = (head_dim, n_head, n_tokens[, 1]) by theta_i = pos * freq_scale * freq_base^(-2i/n_dims)
    with pos an I32 tensor of a.ne[2] positions; dims >= n_dims pass through."""
    op = "rope"
    tensor_arg(op, a)
    tensor_arg(op, pos, "pos")
    dtype_in(op, a, (F32, F16))
    dtype_in(op, pos, (I32,), "pos")
    if pos.n_dims != 1 or pos.ne[0] != a.ne[2]:
        raise ShapeError(f"rope: pos ne={pos.ne} must be a vector of a.ne[2]={a.ne[2]} positions (a ne={a.ne})")
    mode = integer(op, mode, "mode")
    n_dims = integer(op, n_dims, "n_dims")
    if mode not in (ROPE_NORMAL, ROPE_NEOX):
        raise ShapeError(f"rope: mode must be gg.ROPE_NORMAL (0) or gg.ROPE_NEOX (2), got {mode!r}")
    if int(n_dims) != n_dims or n_dims <= 0 or n_dims % 2 or n_dims > a.ne[0]:
        raise ShapeError(f"rope: n_dims must be even, > 0 and <= a.ne[0]={a.ne[0]}, got {n_dims!r}")
    base = finite_number(op, freq_base, "freq_base")
    fscale = finite_number(op, freq_scale, "freq_scale")
    if base <= 0:
        raise ShapeError(f"rope: freq_base must be > 0, got {base}")
    params = RopeParams(int(n_dims), int(mode), base, fscale)
    return Tensor(a.dtype, a.ne, op=op, src=(a, pos), params=params)
