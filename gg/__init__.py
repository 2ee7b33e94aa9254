"""gg: a ggml-style compute-graph runtime for Python with CUDA kernels compiled at run time.

Build lazy graphs of tensors (ggml's ne/nb model), then `gg.build_forward(out).compute()`.
"""
from .backends.base import synchronize
from .context import Context, default_context, new_tensor, tensor
from .dtypes import BF16, F16, F32, I32, DType
from .errors import (BackendError, CompileError, DTypeError, GGError, GraphError, OutOfMemoryError,
                     ShapeError)
from .graph import Graph, Plan, Step, build_forward
from .interop import from_dlpack
from .ops import *  # noqa: F401,F403  (the op constructors)
from .ops import __all__ as _ops_all
from .tensor import Flag, Tensor
from . import llama  # noqa: E402  (builds on everything above)

__version__ = "0.1.0"

__all__ = [
    "Context", "default_context", "tensor", "new_tensor", "Tensor", "Flag", "DType", "F32", "F16", "BF16",
    "I32", "GGError", "ShapeError", "DTypeError", "GraphError", "BackendError", "OutOfMemoryError",
    "CompileError", "Graph", "Plan", "Step", "build_forward", "synchronize", "from_dlpack", *_ops_all,
]
