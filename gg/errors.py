"""The exceptions gg raises. Every one is a `GGError`, so `except gg.GGError` catches them all."""


class GGError(Exception):
    """Base class of every error gg raises on purpose."""


class ShapeError(GGError, ValueError):
    """An op got tensors whose ne (element counts) or strides do not fit its contract."""


class DTypeError(GGError, TypeError):
    """An op or a data transfer got a dtype it does not accept."""


class GraphError(GGError):
    """The graph cannot be planned: a cycle, a tensor from a freed context, no outputs."""


class BackendError(GGError, RuntimeError):
    """A backend is missing, cannot run a step, or failed while running it."""


class OutOfMemoryError(BackendError, MemoryError):
    """A backend could not allocate the bytes it was asked for."""

    def __init__(self, message: str, nbytes: int = 0):
        super().__init__(message)
        self.nbytes = nbytes


class CompileError(BackendError):
    """A CUDA kernel failed to compile; the message carries the NVRTC log."""
