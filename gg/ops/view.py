"""Metadata-only ops: views, reshape, permute, transpose. No kernel runs and no bytes move."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ShapeError
from ..tensor import Tensor, contiguous_strides, pad_ne
from ._check import integer, tensor_arg
from .registry import register

for _name in ("view", "reshape", "permute", "transpose"):
    register(_name, metadata_only=True)


@dataclass(frozen=True)
class PermuteParams:
    axes: tuple[int, int, int, int]


def _view_of(op: str, a: Tensor, ne: Sequence[int], nb: Sequence[int], offset: int,
             params: Any = None) -> Tensor:
    tensor_arg(op, a)
    offset = integer(op, offset, "offset (bytes)", lo=0)
    nb = tuple(integer(op, b, "nb (byte strides)") for b in nb)
    size = a.dtype.size
    if offset % size or any(b % size for b in nb):
        raise ShapeError(f"{op}: view of ne={a.ne} {a.dtype.name}: offset {offset} and strides nb={tuple(nb)} "
                         f"must be multiples of the element size {size} bytes")
    return Tensor(a.dtype, ne, nb, op=op, src=(a,), view_src=a.root, view_offs=a.view_offs + offset,
                  params=params)


def _strides(a: Tensor, ne: Sequence[int], nbs: Sequence[int]) -> tuple[int, ...]:
    given = tuple(integer("view", x, "nb (byte strides)") for x in nbs)
    return (a.dtype.size,) + given + contiguous_strides(a.dtype, pad_ne(ne))[1 + len(nbs):]


def view_1d(a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    """ne0 elements of a starting at byte `offset`."""
    ne = pad_ne((ne0,), "view_1d")
    return _view_of("view", a, ne, _strides(a, ne, ()), offset)


def view_2d(a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    """ne1 rows of ne0 elements, rows nb1 bytes apart, from byte `offset` of a."""
    ne = pad_ne((ne0, ne1), "view_2d")
    return _view_of("view", a, ne, _strides(a, ne, (nb1,)), offset)


def view_3d(a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0) -> Tensor:
    ne = pad_ne((ne0, ne1, ne2), "view_3d")
    return _view_of("view", a, ne, _strides(a, ne, (nb1, nb2)), offset)


def view_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int = 0) -> Tensor:
    ne = pad_ne((ne0, ne1, ne2, ne3), "view_4d")
    return _view_of("view", a, ne, (a.dtype.size, nb1, nb2, nb3), offset)


def reshape(a: Tensor, *ne: int) -> Tensor:
    """Same bytes, new ne (like ggml_reshape_Nd); a must be contiguous and keep its element count."""
    if len(ne) == 1 and isinstance(ne[0], (tuple, list)):
        ne = tuple(ne[0])
    tensor_arg("reshape", a)
    ne = pad_ne(ne, "reshape")
    if not a.is_contiguous():
        raise ShapeError(f"reshape: source ne={a.ne} nb={a.nb} is not contiguous; use gg.cont first")
    n = ne[0] * ne[1] * ne[2] * ne[3]
    if n != a.nelements:
        raise ShapeError(f"reshape: ne={ne} has {n} elements, source ne={a.ne} has {a.nelements}")
    return _view_of("reshape", a, ne, contiguous_strides(a.dtype, ne), 0)


def permute(a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
    """ggml's permute: source dim i moves to position ax_i, so result.ne[ax_i] == a.ne[i]."""
    axes = tuple(integer("permute", ax, "axis") for ax in (ax0, ax1, ax2, ax3))
    tensor_arg("permute", a)
    if sorted(axes) != [0, 1, 2, 3]:
        raise ShapeError(f"permute: axes must be a permutation of 0..3, got {axes} (a ne={a.ne})")
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return _view_of("permute", a, ne, nb, 0, PermuteParams(axes))  # type: ignore[arg-type]


def transpose(a: Tensor) -> Tensor:
    """Swap dims 0 and 1 (a view)."""
    return permute(a, 1, 0, 2, 3)
