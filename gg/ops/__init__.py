"""Op constructors: shape inference, validation and typed params. Nothing here executes."""
from .binary import ScaleParams, add, div, mul, scale, sub
from .copy import cast, cont, cpy
from .matmul import mul_mat
from .norm import NormParams, norm, rms_norm
from .reduce import argmax
from .registry import OPS, OpInfo, info, node_info
from .rope import ROPE_NEOX, ROPE_NORMAL, RopeParams, rope
from .rows import get_rows, set_rows
from .softmax import DiagMaskParams, SoftMaxParams, diag_mask_inf, soft_max, soft_max_ext
from .unary import gelu, silu
from .view import PermuteParams, permute, reshape, transpose, view_1d, view_2d, view_3d, view_4d

__all__ = [
    "add", "sub", "mul", "div", "scale", "silu", "gelu", "rms_norm", "norm", "soft_max", "soft_max_ext",
    "diag_mask_inf", "rope", "ROPE_NORMAL", "ROPE_NEOX", "mul_mat", "argmax", "get_rows", "set_rows", "cont", "cpy", "cast",
    "view_1d", "view_2d", "view_3d", "view_4d", "reshape", "permute", "transpose", "OPS", "OpInfo", "info", "node_info",
    "ScaleParams", "NormParams", "SoftMaxParams", "DiagMaskParams", "RopeParams", "PermuteParams",
]
