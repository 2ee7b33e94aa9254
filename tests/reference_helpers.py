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


# Quantized weights times activations quantized to int8 in the kernel (the CUDA *_qx builds):
# ggml's test-backend-ops bound for quantized activations, instead of 1e-6 for F32 ones.
NMSE_QUANT_ACTIVATIONS = 5e-4


def products_with_quantized_activations(graph) -> int:
    """How many mul_mat ops run in *_qx steps: two plans that quantize the activations of
    different products (Q8_0: the QKV siblings keep F32 fused, stream int8 unfused) differ here
    even when both quantize somewhere."""
    return sum(s.ops.count("mul_mat") for s in graph.plan.steps if str(s.kernel).endswith(("_qx", "_qx_small")))


def quantizes_activations(graph) -> bool:
    return products_with_quantized_activations(graph) > 0


def nmse_vs_reference(graph, f32: float = 1e-6) -> float:
    """The NMSE bound against float64 for a plan with quantized weights."""
    return NMSE_QUANT_ACTIVATIONS if quantizes_activations(graph) else f32


def nmse_fused_vs_plain(graph, plain=None, f32: float = 1e-10) -> float:
    """Fused (norm in the prologue) against unfused (the plan `plain`, when given): with int8
    activations on both sides the two quantize values a float rounding apart, and a rounding that
    lands on the other side of a half moves one q by 1; with them on one side only for some
    product (Q8_0: the streaming build quantizes, the sibling build keeps F32) each is within
    ggml's bound of the exact value, and only that bound holds between them."""
    fused_q = quantizes_activations(graph)
    if plain is not None and products_with_quantized_activations(plain) != products_with_quantized_activations(graph):
        return NMSE_QUANT_ACTIVATIONS
    return 1e-7 if fused_q else f32
