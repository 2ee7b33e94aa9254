import os
import re
import zlib
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

_NO_GPU_HINT = "run `pytest -m cuda` on a GPU machine"


def _cuda_available() -> bool:
    from gg.backends import base
    return base.available("cuda")


def _cuda_unavailable_reason() -> str:
    from gg.backends import base
    return base.cuda_unavailable_reason()


def _asked_for_cuda(config) -> bool:
    """`pytest -m cuda` (or any -m naming cuda without negating it) asks for the GPU tests."""
    expr = config.getoption("markexpr", "") or ""
    return bool(re.search(r"\bcuda\b", expr)) and not re.search(r"\bnot\s+cuda\b", expr)


@pytest.hookimpl(trylast=True)  # after -m has filtered: count only the GPU tests this run selected
def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not gpu or _cuda_available():
        return
    if _asked_for_cuda(config):  # asked for by name: show them skipped rather than hide them
        skip = pytest.mark.skip(reason=f"no CUDA GPU on this machine ({_NO_GPU_HINT})")
        for item in gpu:
            item.add_marker(skip)
        return
    # Without a GPU the GPU tests are left out quietly: one summary line instead of one per test.
    config.hook.pytest_deselected(items=gpu)
    chosen = set(gpu)
    items[:] = [item for item in items if item not in chosen]
    config.stash[_GPU_DESELECTED] = len(gpu)


_GPU_DESELECTED = pytest.StashKey[int]()


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: failures can be replayed from the test id.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def pytest_terminal_summary(terminalreporter, config):
    n_gpu = config.stash.get(_GPU_DESELECTED, 0)
    if n_gpu:
        terminalreporter.write_line(f"{n_gpu} GPU-only test{'s' if n_gpu > 1 else ''} not run: no usable CUDA GPU here "
                                    f"({_cuda_unavailable_reason()}); {_NO_GPU_HINT}")
    # tests/test_sweeps.py counts the hypothesis examples it ran (and passed) per backend
    sweeps = sys.modules.get("test_sweeps")
    cases = getattr(sweeps, "CASES", None)
    if cases is not None and sum(cases.values()):
        terminalreporter.write_line(f"sweeps: {cases['cpu']} cases on cpu, {cases['cuda']} on cuda "
                                    f"(GG_SWEEP_EXAMPLES={sweeps.EXAMPLES} per test and backend)")
