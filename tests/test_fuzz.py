"""The random-graph fuzzer (issue 16): random DAGs of 2-30 ops over every public op, several graphs
sharing nodes computed in random orders, writes into persistent leaves, fused and unfused, CPU and
CUDA, against float64 numpy (tests/fuzz_graphs.py; docs/testing.md explains the limits).

Budget (environment):
    GG_FUZZ_EXAMPLES   programs per test (default 12: the file runs in a few seconds on 2 cores)
    GG_FUZZ_SEED       unset: derandomized (the same programs every run, as CI needs);
                       an integer: random generation from that seed (explore new programs)
The module prints "fuzz: N graphs computed ..." at its end.

Run big on a GPU:  GG_FUZZ_EXAMPLES=2000 python -m pytest -q -m cuda tests/test_fuzz.py
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import gg
from fuzz_graphs import COUNTS, Reference, compare, execute, programs

EXAMPLES = int(os.environ.get("GG_FUZZ_EXAMPLES", "12"))
SEED = os.environ.get("GG_FUZZ_SEED")
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not SEED, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.large_base_example])


def fuzz(fn):
    fn = FUZZ_SETTINGS(fn)
    return seed(int(SEED))(fn) if SEED else fn


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None and COUNTS["graphs"]:
        rep.write_line(f"\nfuzz: {COUNTS['programs']} programs, {COUNTS['graphs']} graph computes, "
                       f"{COUNTS['compared']} values compared, {COUNTS['skipped']} ill-conditioned skipped, "
                       f"intermediates {COUNTS['intermediates_read']} read right / {COUNTS['intermediates_refused']} refused "
                       f"(GG_FUZZ_EXAMPLES={EXAMPLES})")


def check_program(prog, backends):
    """The program fused and unfused on `backends`: each against float64, and against each other."""
    ref = Reference(prog)
    fused = execute(prog, ref, backends, fuse=True)
    unfused = execute(prog, ref, backends, fuse=False, read_intermediates=False)
    assert fused.keys() == unfused.keys()
    last = len(prog.schedule) - 1
    for key, got in fused.items():   # fused == unfused, to the same limits
        i = key[1] if isinstance(key, tuple) else key
        if key in ref.exact.steps[last]:
            exact, noisy = ref.expected(last, key)
            compare(got, np.asarray(unfused[key], np.float64).reshape(exact.shape)
                    if exact.dtype.kind == "f" else unfused[key].reshape(exact.shape), noisy, ref.tol[i],
                    f"#{i} fused vs unfused")
    COUNTS["programs"] += 1


@fuzz
@given(prog=programs())
def test_fuzz_cpu(prog):
    check_program(prog, ("cpu",))


@pytest.mark.cuda
@fuzz
@given(prog=programs())
def test_fuzz_cuda(prog):
    check_program(prog, ("cuda", "cpu"))
