"""Tiny shared helpers for tests that don't need the full reference module."""
import numpy as np


def nmse(actual, ref) -> float:
    """sum((a-b)^2)/sum(b^2) in float64; NaN/inf never pass (returns inf)."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != {b.shape}")
    if not np.all(np.isfinite(a)):
        return float("inf")
    den = float(np.sum(b * b))
    return float(np.sum((a - b) ** 2)) / (den if den > 0 else 1.0)
