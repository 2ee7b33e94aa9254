"""Choosing the next token from logits: greedy, or temperature with top-k / top-p (numpy)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GGError


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.0
    top_k: int = 0       # 0: all tokens
    top_p: float = 1.0   # 1.0: no nucleus cut

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise GGError(f"sampling: temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise GGError(f"sampling: top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise GGError(f"sampling: top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: np.ndarray, p: SamplerParams) -> np.ndarray:
    """The distribution sampling draws from: softmax(logits / T) restricted to the top_k largest
    and then to the smallest set whose mass reaches top_p, renormalized (float64)."""
    x = np.asarray(logits, np.float64).reshape(-1)
    if np.isnan(x).any():
        raise GGError("sampling: the logits contain NaN")
    keep = np.ones(x.size, bool)
    if p.top_k and p.top_k < x.size:
        order = np.argsort(-x, kind="stable")  # ties at the cut: the lower ids stay, exactly k kept
        keep = np.zeros(x.size, bool)
        keep[order[:p.top_k]] = True
    z = np.where(keep, x / max(p.temperature, 1e-10), -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        mass = np.cumsum(probs[order])
        n = int(np.searchsorted(mass, p.top_p) + 1)   # the first prefix whose mass reaches top_p
        nucleus = np.zeros(x.size, bool)
        nucleus[order[:n]] = True
        probs = np.where(nucleus, probs, 0.0)
        probs /= probs.sum()
    return probs


class Sampler:
    """Draws token ids; `seed` makes the sequence reproducible."""

    def __init__(self, params: SamplerParams, seed: int | None = None):
        self.params = params
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(np.asarray(logits).reshape(-1)))
        probs = self.probabilities(logits)
        return int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right").clip(0, probs.size - 1))

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return probabilities(logits, self.params)
