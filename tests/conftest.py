import os
import zlib
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _cuda_available() -> bool:
    from gg.backends import base
    return base.available("cuda")


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (run `pytest -m cuda` on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: failures can be replayed from the test id.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def pytest_terminal_summary(terminalreporter):
    # tests/test_sweeps.py counts the hypothesis examples it ran (and passed) per backend
    sweeps = sys.modules.get("test_sweeps")
    cases = getattr(sweeps, "CASES", None)
    if cases is not None and sum(cases.values()):
        terminalreporter.write_line(f"sweeps: {cases['cpu']} cases on cpu, {cases['cuda']} on cuda "
                                    f"(GG_SWEEP_EXAMPLES={sweeps.EXAMPLES} per test and backend)")
