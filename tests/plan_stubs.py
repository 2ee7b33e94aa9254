"""Stand-in plans for the CUDA lowering's plan-wide rules (gg.backends.cuda.launch.bound: which step
comes before or after, which bytes some step writes), so rules such as the early reads of weights
are checked without a GPU."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


class PlacedMemory:
    """Every tensor at the offset `where` gives for its root, in one buffer."""

    def __init__(self, where: dict):
        self.where = where

    def locate(self, t):
        return SimpleNamespace(ptr=1 << 32), self.where[t.root]


def stub_step(ops, out, choice: Any = None) -> SimpleNamespace:
    """A step running `ops` that writes `out` (choice: the kernel choice the rule looks at)."""
    return SimpleNamespace(ops=tuple(ops), outs=[out], choice=choice if choice is not None else SimpleNamespace())


def in_plan(fn: Callable[[Any], Any], where: dict, steps: list, i: int) -> Any:
    """fn(steps[i]) while `steps` are the plan being lowered, its tensors placed by `where`."""
    from gg.backends.cuda import launch
    with launch.bound(PlacedMemory(where), steps):
        return fn(steps[i])


def check_early_read_rule(rule: Callable[[Any, Any], int], weight, on: int, switch: tuple[Any, str],
                          monkeypatch) -> None:
    """An early-read flag of a weight-reading step (launch.may_read_early's cases, as the kernel
    argument `rule(step, weight)` gives it): `on` behind a softmax step and behind a normalizing
    product, 0 behind a normalization step, in the plan's first step (the kernel before it is not
    the plan's), for weights sharing bytes with a step's output, and with `switch` (a module and
    the name of its A/B constant) or launch.EARLY_WEIGHTS off."""
    import gg
    from gg.backends.cuda import launch
    out = gg.Context().new_tensor(gg.F32, (64,))
    where = {weight: 1 << 20, out: 0}

    def flag(*prev):  # of the mat-vec step after steps running `prev`
        steps = [stub_step(p, out) for p in prev] + [stub_step(("mul_mat",), out)]
        return in_plan(lambda s: rule(s, weight), where, steps, len(prev))
    assert flag(("soft_max",)) == on and flag(("rms_norm", "mul")) == 0
    assert flag(("rms_norm", "mul", "mul_mat", "mul_mat", "silu", "mul")) == on  # a normalizing product
    assert flag() == 0
    where[weight] = 0
    assert flag(("soft_max",)) == 0
    where[weight] = 1 << 20
    monkeypatch.setattr(*switch, False)
    assert flag(("soft_max",)) == 0
    monkeypatch.setattr(*switch, True)
    monkeypatch.setattr(launch, "EARLY_WEIGHTS", False)
    assert flag(("soft_max",)) == 0
