"""gg: a ggml-style compute-graph runtime for Python with CUDA kernels compiled at run time.

Build lazy graphs of tensors (ggml's ne/nb model), then `gg.build_forward(out).compute()`.
"""
from .backends.base import synchronize
from .context import Context, default_context, new_tensor, quantize, tensor
from .dtypes import BF16, F16, F32, I32, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, DType
from .errors import (BackendError, CompileError, DTypeError, GGError, GraphError, OutOfMemoryError,
                     ShapeError)
from .graph import Graph, Plan, Step, build_forward
from .interop import from_dlpack
from .ops import *  # noqa: F401,F403  (the op constructors)
from .ops import __all__ as _ops_all
from .tensor import Flag, Tensor
from . import llama  # noqa: E402  (builds on everything above)
from . import quant  # noqa: E402
from .models import load  # noqa: E402  (gg.load: GGUF files and Hugging Face checkpoints)

__version__ = "0.1.0"

__all__ = [
    "Context", "default_context", "tensor", "new_tensor", "quantize", "Tensor", "Flag", "DType", "F32", "F16",
    "BF16", "I32", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "GGError", "ShapeError", "DTypeError", "GraphError",
    "BackendError", "OutOfMemoryError", "CompileError", "Graph", "Plan", "Step", "build_forward", "synchronize", "from_dlpack", "load", *_ops_all,
]
