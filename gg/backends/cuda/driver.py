"""The CUDA driver binding, its error check and the lock every driver call runs under.

The one place gg imports `cuda.bindings.driver` (None where cuda-python is not installed: the
backend's `available()` says so before anything here is called)."""
from __future__ import annotations

import threading
from typing import Any

from ...errors import BackendError

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - exercised on machines without cuda-python
    cu = None

# Held around everything that touches the driver (runtime.py) and, by the executor, around each
# compute of a plan with CUDA steps: gg drives one stream from whichever thread computes, and
# the driver context is made current in that thread under this lock.
LOCK = threading.RLock()


def check(result: Any, what: str) -> tuple:
    """Unpack a cuda.bindings call's (err, *values); raise BackendError naming `what` on failure."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if int(err) != 0:
        name = cu.cuGetErrorName(err)[1] if cu is not None else b"?"
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise BackendError(f"cuda: {what} failed: {name} ({int(err)})")
    return rest
