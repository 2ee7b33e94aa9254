"""Graphs: ggml build order, leafs/nodes/use counts, networkx export, reuse across computes, writes
into persistent caches (cpy into a view, set_rows) read back in the same graph, cycles, freed contexts."""
from __future__ import annotations

import numpy as np
import pytest

import gg
from reference import NMSE_ELEMENTWISE, NMSE_MUL_MAT, nmse, ref_mul_mat, ref_rms_norm, ref_silu, round_f16

CPU = ("cpu",)


def f32(rng, *shape):
    x = rng.standard_normal(shape).astype(np.float32)
    assert np.all(x != 0)
    return x


# ---- build order -------------------------------------------------------------------------------

def test_build_order_is_post_order_dfs(rng):
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 3, 8), name="x")
    w = ctx.tensor(f32(rng, 8), name="w")
    a = gg.rms_norm(x, 1e-6)          # d's src[0] subtree first ...
    b = gg.mul(a, w)
    c = gg.silu(x)                    # ... then src[1]
    d = gg.add(b, c)
    g = gg.build_forward(d, backends=CPU)
    # DFS from d: b -> a -> x(leaf) ; a ; w(leaf) ; b ; c (x seen) ; c ; d
    assert g.nodes == [a, b, c, d]
    assert g.leafs == [x, w]
    assert g.outputs == [d]

    # successive build_forward_expand calls append after the current nodes
    v = ctx.tensor(f32(rng, 3, 8), name="v")
    e = gg.scale(c, 2.0)              # c is already in the graph: not repeated
    f = gg.sub(v, e)
    g.build_forward_expand(f)
    assert g.nodes == [a, b, c, d, e, f]
    assert g.leafs == [x, w, v]
    assert g.outputs == [d, f]
    g.build_forward_expand(d)         # already there: nothing changes
    assert g.nodes == [a, b, c, d, e, f] and g.outputs == [d, f]


def test_build_order_of_several_outputs_and_src_order(rng):
    ctx = gg.Context()
    p, q = ctx.tensor(f32(rng, 4), name="p"), ctx.tensor(f32(rng, 4), name="q")
    s1 = gg.sub(q, p)                 # src order decides: q before p
    s2 = gg.mul(p, s1)
    g = gg.build_forward(s2, s1, backends=CPU)
    assert g.nodes == [s1, s2]
    assert g.leafs == [p, q]          # p is s2's src[0]: visited first
    assert g.outputs == [s2, s1]
    g2 = gg.build_forward(s1, s2, backends=CPU)
    assert g2.leafs == [q, p]


def test_views_are_nodes_in_order(rng):
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 4, 6), name="x")
    t = gg.transpose(x)
    c = gg.cont(t)
    r = gg.reshape(c, 24)
    y = gg.scale(r, 3.0)
    g = gg.build_forward(y, backends=CPU)
    assert g.nodes == [t, c, r, y] and g.leafs == [x]
    assert [s.ops for s in g.plan.steps] == [("cont",), ("scale",)]   # views get no step
    g.compute()
    np.testing.assert_allclose(y.numpy(), x.numpy().T.reshape(-1) * 3, rtol=1e-6)


def test_deep_chain_does_not_hit_recursion_limit(rng):
    x = gg.Context().tensor(f32(rng, 4))
    y = x
    for _ in range(3000):
        y = gg.scale(y, 1.0)
    g = gg.build_forward(y, backends=CPU)
    assert len(g.nodes) == 3000
    g.compute()
    np.testing.assert_array_equal(y.numpy(), x.numpy())


# ---- use counts, networkx -----------------------------------------------------------------------

def test_use_counts(rng):
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 8), name="x")
    w = ctx.tensor(f32(rng, 8), name="w")
    a = gg.mul(x, w)
    b = gg.add(a, x)
    sq = gg.mul(b, b)                 # one reader that reads b twice
    y = gg.add(sq, a)
    g = gg.build_forward(y, backends=CPU)
    uc = g.use_counts()
    assert uc[x] == 2 and uc[w] == 1 and uc[a] == 2 and uc[b] == 1 and uc[sq] == 1 and uc[y] == 0
    assert set(uc) == set(g.nodes) | set(g.leafs)


def test_to_networkx(rng):
    nx = pytest.importorskip("networkx")
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 3, 8), name="x")
    w = ctx.tensor(f32(rng, 8), name="w")
    y = gg.add(gg.mul(gg.rms_norm(x, 1e-6), w), gg.silu(x))
    g = gg.build_forward(y, backends=CPU)
    G = g.to_networkx()
    assert isinstance(G, nx.DiGraph) and nx.is_directed_acyclic_graph(G)
    assert G.number_of_nodes() == len(g.nodes) + len(g.leafs) == 6
    assert G.number_of_edges() == sum(len(n.src) for n in g.nodes) == 6
    ops = {G.nodes[k]["op"] for k in G.nodes}
    assert ops == {"leaf", "rms_norm", "mul", "silu", "add"}
    assert G.has_edge(id(x), id(y.src[1])) and G.in_degree(id(y)) == 2 and G.out_degree(id(x)) == 2
    order = {k: i for i, k in enumerate(nx.topological_sort(G))}
    pos = [id(n) for n in g.nodes]
    for n in g.nodes:              # build order is a topological order
        for s in n.src:
            if s in g.nodes:
                assert pos.index(id(s)) < pos.index(id(n))
    assert order[id(x)] < order[id(y)]


# ---- reuse across computes --------------------------------------------------------------------

def test_graph_reuse_with_new_inputs(rng):
    ctx = gg.Context()
    x = ctx.new_tensor(gg.F32, (16, 3), name="x")
    w = ctx.tensor(f32(rng, 16), name="w")
    y = gg.silu(gg.mul(gg.rms_norm(x, 1e-6), w))
    g = gg.build_forward(y, backends=CPU)
    plan = None
    for _ in range(3):
        xv = f32(rng, 3, 16)
        x.set(xv)
        g.compute()
        if plan is None:
            plan = g.plan
        assert g.plan is plan                      # planned once, reused
        ref = ref_silu(ref_rms_norm(xv, 1e-6) * w.numpy())
        assert nmse(y.numpy(), ref) <= NMSE_ELEMENTWISE


def test_two_graphs_sharing_leaves(rng):
    ctx = gg.Context()
    x = ctx.tensor(f32(rng, 5))
    y1, y2 = gg.scale(x, 2.0), gg.scale(x, 3.0)
    g1, g2 = gg.build_forward(y1, backends=CPU), gg.build_forward(y2, backends=CPU)
    g1.compute()
    g2.compute()
    g1.compute()
    np.testing.assert_allclose(y1.numpy(), x.numpy() * 2, rtol=1e-6)
    np.testing.assert_allclose(y2.numpy(), x.numpy() * 3, rtol=1e-6)


# ---- caches -----------------------------------------------------------------------------------------

def _attn_scores(ctx, cache, q, n_kv):
    hd = cache.ne[0]
    k = gg.view_2d(cache, hd, n_kv, cache.nb[1], 0)
    return gg.mul_mat(k, q)


@pytest.mark.parametrize("fuse", [True, False])
def test_cpy_into_cache_view_then_read_in_same_graph(rng, fuse):
    hd, n_ctx = 8, 10
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F16, (hd, n_ctx), name="k_cache", persistent=True)
    old = f32(rng, n_ctx, hd)
    cache.set(old)
    expected = round_f16(old)
    n_past = 0
    for T in (3, 2, 1):
        kcur_v = f32(rng, T, hd)
        qv = f32(rng, 2, hd)
        kcur = ctx.tensor(kcur_v, name="k_cur")
        q = ctx.tensor(qv, name="q")
        # the write: F32 rows into an F16 view at n_past
        dst = gg.view_2d(cache, hd, T, cache.nb[1], n_past * cache.nb[1])
        w = gg.cpy(gg.scale(kcur, 1.0), dst)
        # the read: a separate view of the cache, no edge to the write
        kq = _attn_scores(ctx, cache, q, n_past + T)
        g = gg.build_forward(w, backends=CPU, fuse=fuse)
        g.build_forward_expand(kq)
        g.compute()
        expected[n_past:n_past + T] = round_f16(kcur_v)
        n_past += T
        ref = ref_mul_mat(expected[:n_past], qv)
        assert nmse(kq.numpy(), ref) <= NMSE_MUL_MAT * 1e-3   # exact inputs: only float32 sums differ
        np.testing.assert_array_equal(cache.numpy().astype(np.float64), expected)   # older rows kept


def test_read_built_before_the_write_sees_old_values(rng):
    hd, n_ctx = 4, 6
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F32, (hd, n_ctx), persistent=True)
    old = f32(rng, n_ctx, hd)
    cache.set(old)
    new = f32(rng, 2, hd)
    read = gg.cont(gg.view_2d(cache, hd, 3, cache.nb[1], 0))         # built first: reads rows 0..2
    write = gg.cpy(ctx.tensor(new), gg.view_2d(cache, hd, 2, cache.nb[1], cache.nb[1]))   # rows 1..2
    read2 = gg.cont(gg.view_2d(cache, hd, 3, cache.nb[1], 0))        # built after: sees the write
    g = gg.build_forward(read, write, read2, backends=CPU)
    g.compute()
    np.testing.assert_array_equal(read.numpy(), old[:3])
    want = old.copy()
    want[1:3] = new
    np.testing.assert_array_equal(read2.numpy(), want[:3])
    np.testing.assert_array_equal(cache.numpy(), want)


def test_set_rows_into_cache_reused_graph(rng):
    """A decode loop: one graph, the row index and the new row change via set(); reads see every row
    written so far."""
    hd, n_ctx, n_head_kv = 8, 6, 2
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F16, (hd, n_ctx, n_head_kv), name="k_cache", persistent=True)
    init = f32(rng, n_head_kv, n_ctx, hd)
    cache.set(init)
    expected = round_f16(init)
    kcur = ctx.new_tensor(gg.F32, (hd, 1, n_head_kv), name="k_cur")
    idx = ctx.new_tensor(gg.I32, (1,), name="idx")
    q = ctx.new_tensor(gg.F32, (hd, 1, 2 * n_head_kv), name="q")       # GQA: 4 heads over 2
    w = gg.set_rows(cache, kcur, idx)
    k = gg.view_3d(cache, hd, n_ctx, n_head_kv, cache.nb[1], cache.nb[2], 0)
    kq = gg.mul_mat(k, q)
    g = gg.build_forward(w, backends=CPU)
    g.build_forward_expand(kq)
    for pos in (4, 0, 5):
        kv, qv = f32(rng, n_head_kv, 1, hd), f32(rng, 2 * n_head_kv, 1, hd)
        kcur.set(kv)
        idx.set(np.array([pos], np.int32))
        q.set(qv)
        g.compute()
        expected[:, pos] = round_f16(kv[:, 0])
        np.testing.assert_array_equal(cache.numpy().astype(np.float64), expected)
        assert nmse(kq.numpy(), ref_mul_mat(expected, qv)) <= NMSE_MUL_MAT * 1e-3


def test_write_result_tensor_is_a_view_of_the_cache(rng):
    ctx = gg.Context()
    cache = ctx.new_tensor(gg.F32, (4, 5), persistent=True)
    w = gg.cpy(ctx.tensor(f32(rng, 2, 4)), gg.view_2d(cache, 4, 2, cache.nb[1], 2 * cache.nb[1]))
    assert w.view_src is cache and w.view_offs == 2 * cache.nb[1] and w.op == "cpy"
    s = gg.set_rows(cache, ctx.tensor(f32(rng, 1, 4)), ctx.tensor(np.array([0], np.int32)))
    assert s.view_src is cache and s.op == "set_rows" and s.ne == cache.ne


# ---- errors -------------------------------------------------------------------------------------------

def test_cycle_is_a_graph_error(rng):
    x = gg.Context().tensor(f32(rng, 4))
    a = gg.add(x, x)
    b = gg.mul(a, x)
    a.src = (b, x)          # only possible by mutating a node
    with pytest.raises(gg.GraphError, match="cycle"):
        gg.build_forward(b, backends=CPU)
    s = gg.scale(x, 2.0)
    s.src = (s,)            # self loop
    with pytest.raises(gg.GraphError, match="cycle"):
        gg.build_forward(s, backends=CPU)


def test_build_forward_needs_tensors():
    with pytest.raises(gg.GraphError):
        gg.build_forward()
    with pytest.raises(gg.GraphError):
        gg.build_forward(np.ones(3))


def test_freed_context_before_planning(rng):
    ctx = gg.Context()
    y = gg.silu(ctx.tensor(f32(rng, 4)))
    ctx.free()
    g = gg.build_forward(y, backends=CPU)
    with pytest.raises(gg.GraphError, match="freed"):
        g.compute()


def test_freed_context_after_a_compute(rng):
    ctx = gg.Context()
    y = gg.silu(ctx.tensor(f32(rng, 4)))
    g = gg.build_forward(y, backends=CPU)
    g.compute()
    ctx.free()
    with pytest.raises(gg.GGError, match="freed"):
        g.compute()        # must be a gg error, not an AttributeError from deep inside


def test_output_of_one_graph_is_intermediate_of_another(rng):
    # a is g2's output and an intermediate of g1: g1 must not reuse (or scale in place) a's memory.
    x = gg.tensor(f32(rng, 37, 3))
    a = gg.silu(x)
    s = gg.scale(a, 2.0)
    g2 = gg.build_forward(a, backends=CPU)
    g1 = gg.build_forward(s, backends=CPU)
    g2.compute()
    g1.compute()
    want = ref_silu(x.numpy())
    assert np.allclose(a.numpy(), want, rtol=1e-6, atol=1e-6)
    assert np.allclose(s.numpy(), 2 * want, rtol=1e-6, atol=1e-6)


def test_a_graph_reusing_a_node_another_graph_outputs(rng):
    x = gg.tensor(f32(rng, 37, 3))
    a = gg.silu(x)
    s = gg.scale(a, 2.0)
    g1 = gg.build_forward(s, backends=CPU)
    g1.compute()
    assert g1.plan.alloc.inplace       # the scale reuses a's bytes: a is g1's intermediate
    g2 = gg.build_forward(a, backends=CPU)
    g2.compute()
    first = ref_silu(x.numpy())
    x.set(f32(rng, 37, 3))
    g1.compute()                       # its own memory: g2's output is untouched
    assert g1.plan.alloc.inplace
    assert np.allclose(a.numpy(), first, rtol=1e-6, atol=1e-6)  # what g2, a's graph, computed last
    assert np.allclose(s.numpy(), 2 * ref_silu(x.numpy()), rtol=1e-6, atol=1e-6)
    g2.compute()
    assert np.allclose(a.numpy(), ref_silu(x.numpy()), rtol=1e-6, atol=1e-6)
