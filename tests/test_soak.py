"""scripts/soak.py: a short CPU soak passes end to end, its float64 reference agrees with llama_ref,
and its checks fail on bad figures (drift, memory, re-planning, accuracy, CUDA graph replay)."""
import copy
import importlib.util
import json
import os

import numpy as np
import pytest

import gg
from gg import llama as L
from gg.backends import base
from llama_ref import RefLlama
from reference_helpers import nmse

_PATH = os.path.join(os.path.dirname(__file__), "..", "scripts", "soak.py")
_spec = importlib.util.spec_from_file_location("gg_soak_script", _PATH)
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)

TINY = ["--backend", "cpu", "--preset", "tiny", "--prompt", "4"]
# Timing windows of a few ms on a shared CI machine are noisy: the drift limit is loosened here;
# test_drift_and_memory_checks_fail checks the limit itself.
LOOSE = ["--max-drift", "20"]


def test_soak_passes_on_cpu(tmp_path, capsys):
    path = tmp_path / "out" / "soak.json"
    rc = soak.main(TINY + LOOSE + ["--steps", "30", "--check-every", "10", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "soak: PASSED" in out and "decode plan reused" in out and "compute() time drift" in out
    fig = json.loads(path.read_text())
    assert fig["ok"] and fig["steps"] == 30 and fig["config"]["n_ctx"] >= 34
    assert fig["reuse"] == {"replans": 0, "reprepared": 0, "first_bad_step": None}
    assert fig["cuda_graph"]["state"] == "n/a"
    mb, ma = fig["memory"]["before"], fig["memory"]["after"]
    assert mb["gg_buffer_bytes"] == ma["gg_buffer_bytes"] > 0
    assert abs(ma["py_objects"] - mb["py_objects"]) <= 100
    assert fig["timing"]["window"] == 14 and fig["timing"]["steps_timed"] == 29
    # one after the first decode step, two mid-run, then the final one
    assert [c["n_past"] for c in fig["checks"]] == [5, 14, 24, 34]
    final = fig["checks"][-1]
    assert len(final["layers"]) == 2 and final["out_last"] <= soak.NMSE_LIMIT
    assert all(v["ok"] for v in fig["verdicts"])


def test_soak_feedback_and_neox(capsys):
    assert soak.main(TINY + LOOSE + ["--steps", "12", "--check-every", "5", "--feedback", "--rope", "neox",
                                     "--n-head-kv", "1"]) == 0
    assert "fed back" in capsys.readouterr().out


def test_soak_fails_and_exits_1(capsys):
    """A limit no run can meet makes the script fail with status 1 and say which check failed."""
    assert soak.main(TINY + ["--steps", "8", "--max-drift", "0"]) == 1
    out = capsys.readouterr().out
    assert "soak: FAILED" in out and "FAIL  median" in out
    assert soak.main(TINY + LOOSE + ["--steps", "8", "--host-mem-tol", "-1"]) == 1
    assert "host RSS flat" in capsys.readouterr().out


def test_bad_arguments(capsys):
    assert soak.main(TINY + ["--steps", "2"]) == 2
    assert soak.main(TINY + ["--steps", "20", "--n-ctx", "16"]) == 2
    assert "--n-ctx" in capsys.readouterr().err
    if not base.available("cuda"):
        assert soak.main(TINY + ["--steps", "8", "--backend", "cuda"]) == 2


@pytest.mark.parametrize("rope_mode,n_head_kv,chunk", [(gg.ROPE_NORMAL, 2, None), (gg.ROPE_NEOX, 1, 3),
                                                       (gg.ROPE_NORMAL, 4, 4)])
def test_reference_matches_llama_ref(rng, rope_mode, n_head_kv, chunk):
    """The soak's vectorized, chunked float64 model == tests/llama_ref.RefLlama run token by token."""
    cfg = L.Config(n_embd=32, n_head=4, n_head_kv=n_head_kv, n_ff=48, n_ctx=16, n_layer=2, rope_mode=rope_mode)
    layers = L.Weights.random(cfg, gg.Context(), seed=7).numpy()
    xs = rng.standard_normal((11, cfg.n_embd))
    out, ks, vs = soak.reference(cfg, layers, xs, chunk=chunk)
    ref = RefLlama(cfg.n_head, cfg.n_head_kv, cfg.rope_mode, cfg.rope_base, cfg.rope_scale, cfg.eps, layers)
    want = np.concatenate([ref.forward(xs[:5])] + [ref.forward(xs[t:t + 1]) for t in range(5, 11)])
    assert nmse(out, want) <= 1e-20
    for il in range(cfg.n_layer):
        assert nmse(ks[il], np.stack(ref.keys[il])) <= 1e-20
        assert nmse(vs[il], np.stack(ref.values[il])) <= 1e-20


def test_compare_finds_a_bad_row():
    cfg = L.Config(n_embd=32, n_head=4, n_head_kv=2, n_ff=48, n_ctx=12, n_layer=1)
    weights = L.Weights.random(cfg, gg.Context(), seed=1)
    xs = np.random.default_rng(0).standard_normal((10, cfg.n_embd)).astype(np.float32)
    ref = soak.reference(cfg, weights.numpy(), xs)
    sess = L.Session(cfg, weights, backends=("cpu",))
    sess.prefill(xs[:4])
    outs = np.stack([sess.decode(x) for x in xs[4:]])
    good = soak.compare(sess.cache, outs, ref)
    assert not soak.accuracy_failures(good)
    # One corrupted V row out of ten barely moves the whole-tensor NMSE but shows as a row.
    v = sess.cache.v[0].numpy()
    v[..., 7] *= 1.1
    sess.cache.v[0].set(v)
    outs[-1, 0] = np.nan
    fails = soak.accuracy_failures(soak.compare(sess.cache, outs, ref))
    assert any("V cache row 7" in f for f in fails)
    assert any("output at position 9" in f and "inf" in f for f in fails)


def good_figures() -> dict:
    win = {"n": 200, "mean_us": 30.0, "median_us": 30.0, "p99_us": 40.0, "max_us": 50.0}
    layer = {"k_nmse": 1e-8, "k_row_max": 1e-7, "k_row_argmax": 3, "v_nmse": 1e-8, "v_row_max": 1e-7,
             "v_row_argmax": 4}
    mem = {"device_used": 1 << 30, "rss": 1 << 29, "gg_buffers": 40, "gg_buffer_bytes": 1 << 26, "py_objects": 50000}
    return {
        "steps": 2000,
        "reuse": {"replans": 0, "reprepared": 0, "first_bad_step": None},
        "cuda_graph": {"state": "replayed", "segments": 1, "segments_replayed": 1, "recaptures": 0, "error": None},
        "memory": {"before": dict(mem), "after": dict(mem)},
        "timing": {"window": 200, "steps_timed": 1999,
                   "compute": {"first": dict(win), "last": dict(win), "drift": 1.0},
                   "wall": {"first": dict(win), "last": dict(win), "drift": 1.0}},
        "checks": [{"n_past": 2016, "layers": [dict(layer), dict(layer)], "out_max": 1e-9, "out_argmax": 100,
                    "out_last": 1e-10}],
        "prefill_nmse": 1e-9,
    }


LIMITS = {"max_drift": 1.5, "device_tol": 2 << 20, "host_tol": 32 << 20, "object_tol": 100, "nmse": 5e-4}


def failed(fig):
    return [name for name, ok, _ in soak.check_figures(fig, LIMITS) if not ok]


def test_drift_and_memory_checks_fail():
    assert failed(good_figures()) == []

    fig = good_figures()  # last-200 median host time 1.6x the first-200's
    fig["timing"]["compute"]["last"]["median_us"] = 48.0
    fig["timing"]["compute"]["drift"] = 1.6
    assert failed(fig) == ["compute() time drift"]

    fig = good_figures()  # device memory grew by 64 MiB over the loop
    fig["memory"]["after"]["device_used"] += 64 << 20
    assert failed(fig) == ["device memory flat"]

    fig = good_figures()  # host RSS grew past its tolerance
    fig["memory"]["after"]["rss"] += 33 << 20
    assert failed(fig) == ["host RSS flat"]

    fig = good_figures()  # a single leaked gg buffer, however small
    fig["memory"]["after"]["gg_buffers"] += 1
    fig["memory"]["after"]["gg_buffer_bytes"] += 4
    assert failed(fig) == ["gg buffers unchanged"]

    fig = good_figures()  # one Python object leaked per step
    fig["memory"]["after"]["py_objects"] += 1999
    assert failed(fig) == ["Python objects flat"]

    fig = good_figures()  # on CPU there is no device figure: only RSS and buffers are checked
    fig["cuda_graph"]["state"] = "n/a"
    for m in fig["memory"].values():
        m["device_used"] = None
    names = [n for n, _, _ in soak.check_figures(fig, LIMITS)]
    assert "device memory flat" not in names and "CUDA graph replay" not in names and "host RSS flat" in names


def test_reuse_graph_and_accuracy_checks_fail():
    fig = good_figures()
    fig["reuse"]["replans"] = 1999
    assert failed(fig) == ["decode plan reused"]

    fig = good_figures()
    fig["cuda_graph"].update(state="not replayed", segments_replayed=0, error="cuStreamEndCapture: 900")
    assert failed(fig) == ["CUDA graph replay"]
    fig = good_figures()
    fig["cuda_graph"]["recaptures"] = 1
    assert failed(fig) == ["CUDA graph replay"]

    fig = good_figures()
    mid = copy.deepcopy(fig["checks"][0])
    mid["n_past"] = 516
    mid["layers"][1]["v_row_max"] = 3e-3
    fig["checks"].insert(0, mid)
    assert failed(fig) == ["accuracy mid-run (1)"]
    assert "first failure at n_past=516" in soak.table(soak.check_figures(fig, LIMITS))

    fig = good_figures()
    fig["checks"][0]["layers"][0]["k_nmse"] = float("nan")  # NaN never passes
    fig["checks"][0]["out_max"] = 1e-3
    assert failed(fig) == ["final accuracy"]

    fig = good_figures()
    fig["prefill_nmse"] = float("inf")
    assert failed(fig) == ["prefill output"]


def test_timing_figures_windows():
    t = np.concatenate([np.full(300, 1e-5), np.full(300, 2e-5)])
    f = soak.timing_figures(t, t * 3, 200)
    assert f["window"] == 200 and f["compute"]["drift"] == pytest.approx(2.0)
    assert f["wall"]["first"]["median_us"] == pytest.approx(30.0)
    assert soak.timing_figures(t[:10], t[:10], 200)["window"] == 5


def test_cuda_graph_figures(monkeypatch):
    from types import SimpleNamespace as NS
    monkeypatch.delenv("GG_NO_CUDA_GRAPH", raising=False)
    monkeypatch.delenv("GG_DEBUG_GUARDS", raising=False)
    one = NS(records=[0], graph_exec=None, graph_error=None)  # a single kernel is never captured
    good = NS(records=[0, 1, 2], graph_exec=object(), graph_error=None)
    bad = NS(records=[0, 1], graph_exec=None, graph_error="cuStreamEndCapture: 900")
    f = soak.cuda_graph_figures([good, one], 0)
    assert f["state"] == "replayed" and f["segments"] == f["segments_replayed"] == 1
    f = soak.cuda_graph_figures([good, bad], 0)
    assert f["state"] == "not replayed" and "900" in f["error"]
    assert soak.cuda_graph_figures([one], 0)["state"] == "not replayed"
    fig = good_figures()
    fig["cuda_graph"] = soak.cuda_graph_figures([good, bad], 0)
    assert failed(fig) == ["CUDA graph replay"]
    monkeypatch.setenv("GG_NO_CUDA_GRAPH", "1")
    fig["cuda_graph"] = soak.cuda_graph_figures([bad], 0)
    assert fig["cuda_graph"]["state"] == "off" and failed(fig) == []
