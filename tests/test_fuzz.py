"""The random-graph fuzzer (issue 16): random DAGs of 2-30 ops over every public op, several graphs
sharing nodes computed in random orders, writes into persistent leaves, fused and unfused, CPU and
CUDA, against float64 numpy (tests/fuzz_graphs.py; docs/testing.md explains the limits).

Budget (environment):
    GG_FUZZ_EXAMPLES   programs per test (default 50: the file runs in about 5 s on 2 cores)
    GG_FUZZ_SEED       unset: derandomized (the same programs every run, as CI needs);
                       an integer: random generation from that seed (explore new programs)
The session summary gets a line "fuzz: N programs, M graph computes, ..." (counted over all backends).

Run big on a GPU:  GG_FUZZ_EXAMPLES=2000 python -m pytest -q -m cuda tests/test_fuzz.py
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import gg
from fuzz_graphs import COUNTS, Reference, compare, execute, programs

EXAMPLES = int(os.environ.get("GG_FUZZ_EXAMPLES", "50"))
SEED = os.environ.get("GG_FUZZ_SEED")
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not SEED, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.large_base_example])


def fuzz(fn):
    fn = FUZZ_SETTINGS(fn)
    return seed(int(SEED))(fn) if SEED else fn


class _Summary:
    """A plugin registered at run time (conftest.py is not ours): one line in the terminal summary."""

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        if COUNTS["graphs"]:
            terminalreporter.write_line(
                f"fuzz: {COUNTS['programs']} programs, {COUNTS['graphs']} graph computes, {COUNTS['compared']} "
                f"values compared, {COUNTS['skipped']} ill-conditioned not compared, intermediates "
                f"{COUNTS['intermediates_read']} read right / {COUNTS['intermediates_refused']} refused, "
                f"{COUNTS['known_bug_skips']} reads stepped around known bugs, {COUNTS['quantized_weights']} "
                f"quantized weights (GG_FUZZ_EXAMPLES={EXAMPLES})")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    if not request.config.pluginmanager.has_plugin("gg-fuzz-summary"):
        request.config.pluginmanager.register(_Summary(), "gg-fuzz-summary")


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
    if os.environ.get("GG_FUZZ_PROGRESS") and COUNTS["programs"] % 100 == 0:  # long runs: a line per 100
        print(f"fuzz progress: {COUNTS['programs']} programs, {COUNTS['graphs']} graph computes, "
              f"{COUNTS['compared']} values compared", flush=True)


@fuzz
@given(prog=programs())
def test_fuzz_cpu(prog):
    check_program(prog, ("cpu",))


@pytest.mark.cuda
@fuzz
@given(prog=programs())
def test_fuzz_cuda(prog):
    check_program(prog, ("cuda", "cpu"))


@fuzz
@given(prog=programs())
def test_fuzz_cuda_shaped(prog):
    """CUDA's plans (its fusions, epilogues, siblings, moved writes, elided conts, arena offsets)
    computed by the CPU's kernels on any machine (tests/cuda_shaped_backend.py)."""
    import cuda_shaped_backend  # noqa: F401  (registers "cudalike")
    check_program(prog, ("cudalike", "cpu"))


# Products and what surrounds them in a transformer (norms, activations, residuals, row gathers,
# views): more mul_mat nodes a program, so quantized weights (fuzz_graphs.QUANTS) occur in every run.
MATMUL_OPS = ("mul_mat", "mul_mat", "add", "mul", "scale", "silu", "rms_norm", "get_rows", "cont", "permute",
              "transpose", "view_2d", "reshape")


@fuzz
@given(prog=programs(ops=MATMUL_OPS, max_ops=12, quant=0.6))
def test_fuzz_mul_mat_cpu(prog):
    check_program(prog, ("cpu",))


@pytest.mark.cuda
@fuzz
@given(prog=programs(ops=MATMUL_OPS, max_ops=12, quant=0.6))
def test_fuzz_mul_mat_cuda(prog):
    check_program(prog, ("cuda", "cpu"))


@fuzz
@given(prog=programs(ops=MATMUL_OPS, max_ops=12, quant=0.6))
def test_fuzz_mul_mat_cuda_shaped(prog):
    import cuda_shaped_backend  # noqa: F401  (registers "cudalike")
    check_program(prog, ("cudalike", "cpu"))


# ---- bugs the fuzzer found, shrunk by hand and fixed (kept as regression tests) ----
# A new bug goes here as an xfail(strict=True) test with an entry in fuzz_graphs.KNOWN_BUGS (the
# fuzzer steps around it meanwhile); both go once it is fixed.

def test_a_view_output_keeps_what_its_graph_computed():
    x = gg.tensor(np.arange(1, 7, dtype=np.float32))
    h = gg.scale(x, 2.0)
    v = gg.view_1d(h, 3, 0)
    g1 = gg.build_forward(v, backends=("cpu",))
    g2 = gg.build_forward(gg.scale(h, 3.0), keep=[h], backends=("cpu",))
    g1.compute()
    x.set(np.full(6, 10, np.float32))
    g2.compute()   # recomputes h for g2; v is an output of g1 only
    np.testing.assert_array_equal(v.numpy(), [2, 4, 6])


def test_cast_of_a_reshaped_node_computes_when_fused():
    x = gg.tensor(np.arange(8, dtype=np.float32))
    y = gg.cast(gg.reshape(gg.scale(x, 2.0), 2, 4), gg.F16)
    gg.build_forward(y, backends=("cpu",)).compute()
    np.testing.assert_array_equal(y.numpy(), (2 * np.arange(8)).reshape(4, 2).astype(np.float16))


def test_a_cont_of_a_cont_before_a_product_computes():
    """Cont elision dropped both conts but pointed the product at the first, which has no memory
    (tests/test_elide.py checks cudalike plans and a transposed source too)."""
    x, w = gg.tensor(np.array([1.5], np.float32)), gg.tensor(np.array([2.0], np.float32))
    y = gg.mul_mat(gg.cont(gg.cont(x)), w)
    gg.build_forward(y, backends=("cpu",)).compute()
    np.testing.assert_array_equal(y.numpy(), [3.0])
