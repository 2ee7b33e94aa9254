"""Several CUDA devices (issue 22): names, the layer split the planner makes, and (on a GPU) a
model split over two logical devices of one GPU (GG_CUDA_DEVICES=0,0) computing what one device
computes. Plans need no GPU."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from gg import llama as L
from gg.backends import base
from gg.graph.assign import layer_split


def _model(n_layer: int = 4, n_embd: int = 64):
    cfg = L.Config(n_embd=n_embd, n_head=4, n_head_kv=2, n_ff=96, n_ctx=32, n_layer=n_layer, wtype=gg.F16,
                   kv_type=gg.F16)
    ctx = gg.Context()
    return cfg, L.Weights.random(cfg, ctx), L.KVCache(cfg, ctx), ctx


def _steps(n_layer: int, devices=("cuda:0", "cuda:1", "cpu")):
    cfg, w, cache, ctx = _model(n_layer)
    gf, x, out = L.build_forward_pass(cfg, w, cache, L.Batch.indexed(cfg, ctx, 1), backends=devices)
    return gf.plan.steps


@pytest.mark.parametrize("name,canon", [("cuda:0", "cuda"), ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("cuda:12", "cuda:12")])
def test_device_names(name, canon):
    assert base.canonical(name) == canon
    assert base.get(name).name == canon


@pytest.mark.parametrize("bad", ["cuda:", "cuda:x", "cuda:-1", "cuda:01", "cuda:1.0"])
def test_a_malformed_device_name_is_refused(bad):
    x = gg.tensor(np.ones(3, np.float32))
    with pytest.raises(gg.BackendError, match="cuda"):
        gg.build_forward(gg.scale(x, 2.0), backends=(bad, "cpu"))


@pytest.mark.parametrize("n_layer", [2, 4, 5])
def test_layer_split_cuts_at_a_layer_boundary(n_layer):
    steps = _steps(n_layer)
    devs = [s.backend for s in steps if s.ops != ("transfer",)]
    # one run per device, in order
    assert devs == sorted(devs, key=["cuda", "cuda:1", "cpu"].index)
    assert set(devs) == {"cuda", "cuda:1"}
    # only the residual stream and the step's small inputs cross: no value of a layer's inside
    moved = [s.out.src[0] for s in steps if s.ops == ("transfer",)]
    computed = [t for t in moved if t.op is not None]
    assert len(computed) == 1 and computed[0].op == "add"
    assert all(t.op is None and t.nelements <= 64 for t in moved if t.op is None)  # positions, indices, mask
    # the inputs' transfers lead the plan (one segment), so device 1's run is not cut apart
    n_inputs = len(moved) - 1
    assert all(s.ops == ("transfer",) and s.out.src[0].op is None for s in steps[:n_inputs])
    runs = [s.backend for s in steps if s.ops != ("transfer",)]
    assert sum(1 for a, b in zip(runs, runs[1:]) if a != b) == 1
    # each layer's KV cache writes run on one device, with the layer
    for il in range(n_layer):
        writers = {s.backend for s in steps if any(n.op == "set_rows" and n.src[0].root.name.endswith(f"_l{il}")
                                                   for n in s.nodes)}
        assert len(writers) == 1


def test_layer_split_balances_the_weight_bytes():
    cfg, w, cache, ctx = _model(6)
    gf, x, out = L.build_forward_pass(cfg, w, cache, L.Batch.indexed(cfg, ctx, 1),
                                      backends=("cuda", "cuda:1", "cuda:2", "cpu"))
    where = layer_split(gf.nodes, ("cuda", "cuda:1", "cuda:2", "cpu"))
    per: dict[str, int] = {}
    seen: set = set()
    for n in gf.nodes:
        if n in where:
            for s in n.src:
                if s.root.op is None and s.root not in seen:
                    seen.add(s.root)
                    per[where[n]] = per.get(where[n], 0) + s.root.storage_bytes
    assert set(per) == {"cuda", "cuda:1", "cuda:2"}
    assert max(per.values()) <= 1.5 * min(per.values())  # 6 layers over 3 devices: 2 each


def test_one_device_makes_no_split():
    assert layer_split([], ("cuda", "cpu")) == {}
    assert {s.backend for s in _steps(2, ("cuda", "cpu"))} == {"cuda"}


def test_load_devices_and_backends_are_exclusive(tmp_path):
    with pytest.raises(gg.GGError, match="not both"):
        gg.load(tmp_path, backends=("cpu",), devices=2)
    with pytest.raises(gg.GGError, match="positive int"):
        gg.load(tmp_path, devices=0)


@pytest.mark.cuda
def test_a_model_split_over_two_logical_devices_computes_what_one_computes(monkeypatch):
    monkeypatch.setenv("GG_CUDA_DEVICES", "0,0")
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((6, 256)).astype(np.float32)
    outs = {}
    for devices in (("cuda", "cpu"), ("cuda", "cuda:1", "cpu")):
        cfg = L.Config(n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=64, n_layer=4, wtype=gg.F16,
                       kv_type=gg.F16)
        ctx = gg.Context()
        sess = L.Session(cfg, L.Weights.random(cfg, ctx, seed=7), L.KVCache(cfg, ctx), backends=devices)
        got = [sess.prefill(xs[:3])]
        got += [sess.decode(xs[i:i + 1]) for i in range(3, 6)]
        outs[devices] = np.concatenate([np.asarray(g).reshape(-1, 256) for g in got])
    one, two = outs.values()
    assert np.isfinite(two).all()
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)
