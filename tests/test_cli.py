"""The command line (help, info, demo, kernels, run/bench dispatch, unknown commands), the
printed plan (footer, human-readable sizes) and bench/bench_models.py's --const."""
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import fake_backend  # noqa: F401  (registers the "fake" backend: a plan with inserted steps)
import gg
from gg.__main__ import _cuda_why, main
from gg.backends import base
from gg.graph.plan import human_bytes

FOOTER = "(* = inserted by the planner)"


def test_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for cmd in ("demo", "run", "bench", "kernels", "info"):
        assert re.search(rf"^  {cmd}\s", out, re.M), cmd


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


# ---- info ---------------------------------------------------------------------------------------
def test_info_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "gg", "info"], capture_output=True, text=True, check=True).stdout
    assert "backend cpu   available" in out
    assert re.search(r"^  NVRTC\s+(usable, version \d+\.\d+|not usable \(.+\))", out, re.M), out
    if not base.available("cuda"):  # says why, not only "not available"
        assert re.search(r"backend cuda  not available: \S", out), out


def test_info_when_nvrtc_is_broken(capsys, monkeypatch):
    from gg.backends.cuda import compiler

    def broken():
        raise gg.CompileError("cuda: NVRTC is not importable (test)")
    monkeypatch.setattr(compiler, "nvrtc_version", broken)
    assert main(["info"]) == 0
    assert re.search(r"NVRTC\s+not usable \(cuda: NVRTC is not importable \(test\)\)", capsys.readouterr().out)


@pytest.mark.parametrize("installed, reason, says", [
    (False, "No module named 'cuda'", "cuda-python is not installed"),
    (True, "cuInit: CUresult.CUDA_ERROR_NO_DEVICE", "sees no GPU"),
    (True, '"cuda" is an NVIDIA driver library and can only be found via system search', "no usable NVIDIA driver"),
    (True, "something new", "something new"),
])
def test_cuda_reason_in_the_users_terms(installed, reason, says):
    why = _cuda_why(types.SimpleNamespace(installed=installed), reason)
    assert says in why and reason in why


# ---- demo ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--prompt", "0"], "the prompt needs at least one token"),
    (["--prompt", "-3"], "the prompt needs at least one token"),
    (["--steps", "-1"], "cannot be negative"),
    (["--prompt", "100", "--steps", "29", "--n-ctx", "128"], "129 positions do not fit in --n-ctx 128"),
])
def test_demo_refuses_bad_lengths_cleanly(capsys, args, says):
    assert main(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and err.count("\n") == 1


# ---- run / bench (gg.models.cli, imported only when asked for) ----------------------------------
@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_run_and_bench_dispatch_to_models_cli(monkeypatch, cmd):
    seen = {}
    fake = types.ModuleType("gg.models.cli")
    fake.run_main = lambda argv: seen.setdefault("run", argv) and 0
    fake.bench_main = lambda argv: seen.setdefault("bench", argv) and 7
    monkeypatch.setitem(sys.modules, "gg.models.cli", fake)
    assert main([cmd, "--model", "x.gguf"]) == (0 if cmd == "run" else 7)
    assert seen == {cmd: ["--model", "x.gguf"]}


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_run_and_bench_without_models_cli_say_so(monkeypatch, capsys, cmd):
    monkeypatch.setitem(sys.modules, "gg.models.cli", None)  # importing it raises ImportError
    assert main([cmd]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{cmd}: ") and "gg.models.cli" in err and "Traceback" not in err


# ---- kernels --------------------------------------------------------------------------------------
_TWO_KERNELS = r'''
extern "C" __global__ void small_k(float* p) { p[threadIdx.x] = 1.0f; }
extern "C" __global__ void big_k(float* p, int n) {
    float a = p[threadIdx.x];
    #pragma unroll
    for (int i = 0; i < 64; ++i) a = a * p[(threadIdx.x + i) % n] + sinf(a);
    p[threadIdx.x] = a;
}
'''


def test_kernels_prints_progress_and_each_kernels_own_size(capsys, monkeypatch, tmp_path):
    try:
        from gg.backends.cuda import catalog, compiler
        compiler.nvrtc_version()
    except Exception as e:  # cuda-python / NVRTC not installed here
        pytest.skip(f"NVRTC not importable: {e}")
    monkeypatch.setenv("GG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(catalog, "variants", lambda: [
        catalog.Variant("two.cu", "small_k"), catalog.Variant("two.cu", "big_k"),
        catalog.Variant("two.cu", "missing_k")])
    monkeypatch.setattr(compiler, "compile_file", lambda f, arch: compiler.compile_source(_TWO_KERNELS, f, arch))
    assert main(["kernels", "--arch", "sm_80"]) == 1  # missing_k is not in the CUBIN
    out, err = capsys.readouterr()
    assert "[1/1] compiling two.cu" in err
    assert "symbol missing_k not found in the CUBIN of two.cu" in err
    sizes = {m[0]: int(m[1]) for m in re.findall(r"^(\w+_k)\s+sm_80\s+(\d+) B\s+two\.cu\s+(?:ok|ERROR)", out, re.M)}
    cubin_size = len(compiler.compile_file("two.cu", "sm_80"))
    assert 0 < sizes["small_k"] < sizes["big_k"] < cubin_size and sizes["missing_k"] == 0, (sizes, cubin_size)
    assert "2/3 kernels compiled for sm_80 from 1 files" in out


# ---- the printed plan ---------------------------------------------------------------------------
def test_plan_footer_only_when_a_step_is_starred(rng):
    x = gg.tensor(rng.standard_normal((3, 32)).astype(np.float32))
    w = gg.tensor(rng.standard_normal(32).astype(np.float32))
    plain = gg.build_forward(gg.rms_norm(x, 1e-6) * w, backends=("cpu",)).plan
    assert not plain.inserted and FOOTER not in str(plain) and " *" not in str(plain)
    host = gg.Context(backend="cpu")
    y = gg.rms_norm(host.tensor(rng.standard_normal((3, 32)).astype(np.float32)), 1e-6)
    moved = gg.build_forward(y, backends=("fake", "cpu")).plan  # the input is carried to "fake"
    text = str(moved)
    assert moved.inserted and "transfer *" in text and text.endswith(FOOTER)


@pytest.mark.parametrize("n, shown", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (10 * 1024 - 6, "9.99 KiB"),
    (10 * 1024 - 1, "10.0 KiB"), (100 * 1024, "100 KiB"), (2**20 - 300, "1.00 MiB"), (3 * 2**30, "3.00 GiB"),
    (4 * 10**12, "3.64 TiB"), (2**50, "1.00 PiB"),
])
def test_human_bytes(n, shown):
    assert human_bytes(n) == shown


def test_plan_sizes_are_human_readable():
    # get_rows of a 1 MiB row 2**22 times: a 4 TiB output, planned (never allocated)
    ctx = gg.Context()
    table = ctx.new_tensor(gg.F32, (1 << 18, 1))
    idx = ctx.new_tensor(gg.I32, (1 << 22,))
    plan = gg.build_forward(gg.get_rows(table, idx), backends=("cpu",)).plan
    text = str(plan)
    assert "4.00 TiB" in text and "4.00 TiB" in plan.summary()
    assert not re.search(r"\d{5,}(\.\d+)? [KMGT]iB", text), text


# ---- bench/bench_models.py --const ----------------------------------------------------------------
def test_bench_models_runs_gg_with_a_const_set(monkeypatch):
    """bench_models.py --const runs `gg bench` with the switch applied first (scripts/plan_consts.py):
    a constant no family has stops it before the model loads; a real one reaches the model."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    import bench_models
    with pytest.raises(RuntimeError, match="--const: blocks has no NOPE"):
        bench_models.gg_bench("/nonexistent.gguf", 8, 4, 1, ["blocks.NOPE=0"])
    with pytest.raises(RuntimeError, match="no such file: /nonexistent.gguf"):
        bench_models.gg_bench("/nonexistent.gguf", 8, 4, 1, ["blocks.MVS_EVICT_FIRST=0"])
