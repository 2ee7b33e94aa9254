"""Random DAGs over gg's public ops, and their float64 evaluation: the engine of tests/test_fuzz.py.

A `Program` is plain data: items (leaves and op nodes, each with its ne, dtype and where its bytes
live: the root item, element strides and element offset), the graphs built over them (outputs and
kept tensors) and the order the graphs are computed in. `programs()` draws one with hypothesis;
`build()` turns it into gg tensors through the public API only; `simulate()` replays the schedule
in float64 numpy (tests/reference.py's ref_* functions, numpy order = ne[::-1], always 4 axes here),
with the writes into leaves (cpy into a view of a persistent cache, set_rows) applied in each graph's
build order (ggml's post-order DFS), as DESIGN §1 promises.

Precision (docs/testing.md explains it): every op node's reference is rounded to its dtype, as gg
stores it; an output's limit is max(the largest DESIGN §7 NMSE threshold on its path, 4 x the NMSE by
which the float64 evaluation itself moves when every node on the path is perturbed by relative noise
of its own threshold, a mul_mat's activations too). An output the perturbation moves by more than ILL_CONDITIONED is not compared
(counted in SKIPPED). Generation keeps values in sane ranges (see the guards in `_Gen`).
"""
from __future__ import annotations

import os
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

import gg
from reference import (NMSE_BF16, NMSE_ELEMENTWISE, NMSE_F16, NMSE_MUL_MAT, NMSE_NORM, NMSE_SOFTMAX,
                       nmse, ref_add, ref_cpy, ref_diag_mask_inf, ref_div, ref_gelu, ref_get_rows, ref_mul,
                       ref_mul_mat, ref_norm, ref_rms_norm, ref_rope, ref_scale, ref_silu, ref_soft_max,
                       ref_sub, round_bf16, round_f16)

F32, F16, BF16, I32 = gg.F32, gg.F16, gg.BF16, gg.I32
FLOATS = (F32, F16, BF16)
# Block-quantized weights (new mul_mat weights of F32 products with K a multiple of 32): made and
# decoded by the gguf package's own numpy quantizer, so the reference owes nothing to gg.quant.
QUANTS = (gg.Q8_0, gg.Q4_0, gg.Q4_1)

SIZES = (1, 1, 2, 3, 5, 7, 8, 16, 17, 32, 33, 65)   # odd sizes and their neighbours; 1 twice: broadcasts
MAX_ELEMS = 2048        # elements of one tensor (the Python-loop references stay fast)
MAX_ABS = 1e3           # |values| of every generated node stay below this (F16 tops out at 65504)
MAX_LOGIT = 30.0        # |soft_max input * scale| at most this (larger logits are ill-conditioned)
ILL_CONDITIONED = 1e-2  # perturbation NMSE above which an output is not compared
PERTURBATIONS = 2       # perturbed evaluations per program

OP_TOL = {  # DESIGN §7, per op (storage rounding to F16 / BF16 adds STORAGE_TOL)
    "add": NMSE_ELEMENTWISE, "sub": NMSE_ELEMENTWISE, "mul": NMSE_ELEMENTWISE, "div": NMSE_ELEMENTWISE,
    "scale": NMSE_ELEMENTWISE, "silu": NMSE_ELEMENTWISE, "gelu": NMSE_ELEMENTWISE, "rope": NMSE_ELEMENTWISE,
    "rms_norm": NMSE_NORM, "norm": NMSE_NORM, "soft_max": NMSE_SOFTMAX, "soft_max_ext": NMSE_SOFTMAX,
    "diag_mask_inf": 0.0, "mul_mat": NMSE_MUL_MAT, "get_rows": 0.0, "set_rows": 0.0, "cont": 0.0,
    "cpy": 0.0, "cast": 0.0, "argmax": 0.0,
}
STORAGE_TOL = {F32: 0.0, F16: NMSE_F16, BF16: NMSE_BF16, I32: 0.0}
VIEW_OPS = ("view_1d", "view_2d", "view_3d", "view_4d", "reshape", "permute", "transpose")
WRITE_OPS = ("cpy", "set_rows")
ALL_OPS = ("add", "sub", "mul", "div", "scale", "silu", "gelu", "rms_norm", "norm", "soft_max", "soft_max_ext",
           "diag_mask_inf", "rope", "mul_mat", "get_rows", "set_rows", "cont", "cpy", "cast", "argmax") + VIEW_OPS

# gg bugs the fuzzer found that are not fixed yet (each has an xfail(strict) regression test in
# tests/test_fuzz.py): the checker steps around them so the rest stays tested. GG_FUZZ_KNOWN_BUGS=check
# checks them anyway; delete an entry once its regression test passes.
KNOWN_BUGS: set[str] = set()  # none left: both bugs the fuzzer found are fixed (their tests in test_fuzz.py)

COUNTS: Counter = Counter()   # graphs computed, outputs compared, outputs skipped (ill-conditioned) ...


# ---- the program ---------------------------------------------------------------------------------

@dataclass
class Item:
    """A leaf (op None) or an op node. Its bytes: element (offs + sum(i_k * nb[k])) of root's
    contiguous storage (a root is a leaf or a non-view op node: nb contiguous, offs 0)."""
    op: str | None
    srcs: tuple
    params: tuple
    ne: tuple
    dtype: object
    root: int
    nb: tuple
    offs: int = 0
    kind: str = ""             # leaves: normal | away0 | mask | pos | idx | rows (distinct indices)
    persistent: bool = False   # leaves written by cpy / set_rows
    neg_inf: bool = False      # may hold -inf (diag_mask_inf, masks); never +inf or NaN
    stateful: bool = False     # depends on a leaf that cpy / set_rows write


@dataclass
class Program:
    seed: int
    items: list
    graphs: list               # [(outputs, kept)] item indices
    schedule: tuple            # graph indices, in compute order

    def __repr__(self) -> str:
        lines = [f"Program(seed={self.seed}, schedule={self.schedule})"]
        for i, it in enumerate(self.items):
            what = (f"leaf {it.kind}{' persistent' if it.persistent else ''}" if it.op is None else
                    f"{it.op}({', '.join(f'#{s}' for s in it.srcs)}{''.join(f', {p!r}' for p in it.params)})")
            view = "" if it.root == i else f" view of #{it.root} nb={it.nb} offs={it.offs}"
            lines.append(f"  #{i} = {what} ne={it.ne} {it.dtype.name}{view}")
        for g, (outs, kept) in enumerate(self.graphs):
            lines.append(f"  graph {g}: outputs {list(outs)} keep {list(kept)}")
        return "\n".join(lines)


def contiguous(ne) -> tuple:
    return (1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2])


def nelements(ne) -> int:
    return int(np.prod(ne))


def is_contiguous(it: Item) -> bool:
    want = 1
    for n, b in zip(it.ne, it.nb):
        if n != 1:
            if b != want:
                return False
            want *= n
    return True


# ---- float64 values ---------------------------------------------------------------------------------

def _gguf(dtype):
    """The gguf package's numpy quantizer and its name for `dtype` (a test dependency)."""
    from gguf import GGMLQuantizationType, quants
    return quants, GGMLQuantizationType[dtype.name.upper()]


def quantized_bytes(x, dtype) -> np.ndarray:
    """ggml's blocks of float32 x (rows of x.shape[-1] elements), by the gguf package."""
    quants, t = _gguf(dtype)
    return quants.quantize(np.asarray(x, np.float32), t)


def stored(x, dtype) -> np.ndarray:
    """float64 values of x as `dtype` stores them."""
    if dtype in QUANTS:
        quants, t = _gguf(dtype)
        return quants.dequantize(quantized_bytes(x, dtype), t).astype(np.float64).reshape(np.shape(x))
    if dtype is F16:
        return round_f16(x)
    if dtype is BF16:
        return round_bf16(x)
    if dtype is I32:
        return np.asarray(x).astype(np.int64)
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def positions(it: Item) -> np.ndarray:
    """Flat element positions in the root's storage, numpy order (ne[::-1])."""
    grids = np.ix_(*[np.arange(n) * b for n, b in zip(it.ne[::-1], it.nb[::-1])])
    return it.offs + sum(grids)


def leaf_values(seed: int, i: int, it: Item) -> np.ndarray:
    """The float32 / int32 array (numpy order) given to gg for leaf #i: random, never zero."""
    rng = np.random.default_rng(zlib.crc32(f"{seed}:{i}".encode()))
    shape = it.ne[::-1]
    if it.kind == "pos":
        return rng.integers(-3, 64, size=shape).astype(np.int32)
    if it.kind == "idx":
        return rng.integers(0, it.params[0], size=shape).astype(np.int32)
    if it.kind == "rows":  # distinct rows per (i2, i3): duplicates would make set_rows order-dependent
        n_rows, n = it.params[0], it.ne[0]
        return np.stack([rng.permutation(n_rows)[:n] for _ in range(it.ne[1] * it.ne[2])]).reshape(shape).astype(np.int32)
    if it.kind == "fresh":  # uninitialised in gg (new_tensor's zeros): the cpy fills all of it
        return np.zeros(shape, np.float32)
    if it.kind == "away0":  # |x| in [0.5, 2): divisors
        x = (0.5 + 1.5 * rng.random(shape)) * rng.choice([-1.0, 1.0], size=shape)
    else:
        x = rng.standard_normal(shape) * (it.params[0] if it.params else 1.0)
        x[x == 0] = 0.5
        if it.kind == "mask":  # ~1/8 of the entries -inf, never column 0 (rows keep a finite value)
            hide = rng.random(shape) < 0.125
            hide[..., 0] = False
            x[hide] = -np.inf
    return x.astype(np.float32)


def apply(op: str, params: tuple, ins: list, it: Item) -> np.ndarray:
    """The float64 result of a (non-view, non-write) op on 4-axis float64 inputs, unrounded."""
    a = ins[0]
    if op in ("add", "sub", "mul", "div"):
        return {"add": ref_add, "sub": ref_sub, "mul": ref_mul, "div": ref_div}[op](a, ins[1])
    if op == "scale":
        return ref_scale(a, params[0])
    if op in ("silu", "gelu"):
        return (ref_silu if op == "silu" else ref_gelu)(a)
    if op in ("rms_norm", "norm"):
        return (ref_rms_norm if op == "rms_norm" else ref_norm)(a, params[0])
    if op == "soft_max":
        return ref_soft_max(a)
    if op == "soft_max_ext":
        return ref_soft_max(a, ins[1] if len(ins) > 1 else None, params[0], params[1])
    if op == "diag_mask_inf":
        return ref_diag_mask_inf(a, params[0])
    if op == "rope":
        return ref_rope(a, ins[1].reshape(-1), *params)
    if op == "mul_mat":
        return ref_mul_mat(a, ins[1])
    if op == "get_rows":
        return ref_get_rows(a, ins[1][0])
    if op == "argmax":
        return np.argmax(a, axis=-1)[..., None].astype(np.int64)
    if op in ("cont", "cast"):
        return np.array(a, np.float64)
    raise AssertionError(f"no reference for {op}")


class Evaluation:
    """One float64 replay of a program's schedule; `noise` (a seed) perturbs every op node's result
    by relative +-sqrt(its own threshold) per element, and a mul_mat's activations before it (the
    conditioning probe)."""

    def __init__(self, prog: Program, noise: int | None = None):
        self.prog = prog
        self.rng = None if noise is None else np.random.default_rng(noise)
        items = prog.items
        self.leaf = {i: stored(leaf_values(prog.seed, i, it), it.dtype).reshape(-1)
                     for i, it in enumerate(items) if it.op is None}
        self.vals: dict = {}   # root item -> flat values of the current compute (op roots)
        self.steps: list = []  # per compute: {item: expected numpy-order value} for every readable item
        self.stale: list = []  # per compute: view outputs whose root a later compute of another graph redid
        self.when: dict = {}   # output -> compute that snapshotted it; op node -> last compute that ran it
        self.last: dict = {}   # readable item -> expected value (snapshots; stateful aliases re-read)
        for g in prog.schedule:
            self._compute(g)

    def _noisy(self, v: np.ndarray, tol: float) -> np.ndarray:
        if self.rng is None or tol == 0.0:
            return v
        return v * (1.0 + np.sqrt(tol) * self.rng.choice([-1.0, 1.0], size=v.shape))

    def read(self, i: int) -> np.ndarray:
        """Current value of item i (numpy order, 4 axes)."""
        it = self.prog.items[i]
        flat = self.leaf[it.root] if it.root in self.leaf else self.vals[it.root]
        return flat[positions(it)]

    def _compute(self, g: int) -> None:
        prog = self.prog
        outs, kept = prog.graphs[g]
        self.vals = {}
        for i in build_order(prog, outs):
            it = prog.items[i]
            if it.op is None or it.op in VIEW_OPS:
                continue   # views alias their root: read when a kernel reads them
            ins = [self.read(s) for s in it.srcs]
            if it.op == "cpy":
                v = self._noisy(stored(ref_cpy(ins[0], it.ne[::-1], np.float64), it.dtype), STORAGE_TOL[it.dtype])
                self.leaf[it.root][positions(it)] = v
            elif it.op == "set_rows":
                dst = prog.items[it.srcs[0]]
                pos = positions(dst)           # (d3, d2, rows, ne0)
                src, idx = ins[1], ins[2][0]   # (s3, s2, n, ne0), (i3, i2, n)
                v = self._noisy(stored(src, it.dtype), STORAGE_TOL[it.dtype])
                for k3 in range(src.shape[0]):
                    for k2 in range(src.shape[1]):
                        for j in range(src.shape[2]):
                            r = int(idx[k3 % idx.shape[0], k2 % idx.shape[1], j])
                            self.leaf[it.root][pos[k3, k2, r]] = v[k3, k2, j]
            else:
                if it.op == "mul_mat" and self.rng is not None:
                    # a product's error (F32 sums, int8 activations) is relative to its terms, not to
                    # their sum: the activations take the noise too, so a sum that cancels reads as
                    # ill-conditioned (a Q4_0 dot of 32 terms summing to 0.2% of sum |w x| was flagged)
                    ins = [ins[0], self._noisy(ins[1], OP_TOL["mul_mat"])]
                v = stored(apply(it.op, it.params, ins, it), it.dtype)
                if it.dtype is not I32:
                    v = self._noisy(v, OP_TOL[it.op] + STORAGE_TOL[it.dtype])
                self.vals[i] = v.reshape(-1)
                self.when[("ran", i)] = len(self.steps)
        for o in list(outs) + list(kept):
            self.when[o] = len(self.steps)
            if not prog.items[o].stateful or prog.items[prog.items[o].root].op is not None:
                self.last[o] = self.read(o)     # a snapshot: what this compute wrote
            else:
                self.last[o] = None             # an alias of a written leaf: its current bytes
        step = {}
        for o, v in self.last.items():
            step[o] = self.read(o) if v is None else v
        for i, v in self.leaf.items():
            if prog.items[i].persistent:
                step[("leaf", i)] = v.reshape(prog.items[i].ne[::-1]).copy()
        self.steps.append(step)
        self.stale.append({o for o in self.last if prog.items[o].root != o and prog.items[prog.items[o].root].op
                           and self.when.get(("ran", prog.items[o].root), -1) > self.when[o]})


def build_order(prog: Program, outs) -> list:
    """ggml's build order: post-order DFS from each output in turn, sources in order."""
    seen, order = set(), []
    for o in outs:
        stack = [(o, 0)]
        while stack:
            i, k = stack.pop()
            if i in seen:
                continue
            srcs = prog.items[i].srcs
            if k < len(srcs):
                stack.append((i, k + 1))
                if srcs[k] not in seen:
                    stack.append((srcs[k], 0))
                continue
            seen.add(i)
            order.append(i)
    return order


def path_tolerance(prog: Program) -> list:
    """The largest DESIGN threshold (op and storage) on each item's path; a written leaf takes its
    writers' (whose sources never read a written leaf: two passes settle it)."""
    items, tol = prog.items, [0.0] * len(prog.items)
    for _ in range(2):
        for i, it in enumerate(items):
            own = 0.0 if it.op is None or it.op in VIEW_OPS else OP_TOL[it.op] + STORAGE_TOL[it.dtype]
            tol[i] = max([own, tol[i] if it.op is None else 0.0] + [tol[s] for s in it.srcs] +
                         ([tol[it.root]] if it.root != i else []))
            if it.op in WRITE_OPS:
                tol[it.root] = max(tol[it.root], tol[i])
    return tol


# ---- generation -----------------------------------------------------------------------------------

class Reject(Exception):
    """This op does not fit here (shape, range or conditioning): draw another."""


class _Gen:
    """Draws items one op at a time, keeping generation-time float64 values for the range guards."""

    def __init__(self, draw, seed: int, quant: float = 0.0):
        self.draw, self.seed, self.quant = draw, seed, quant  # quant: new mul_mat weights that are QUANTS
        self.items: list = []
        self.vals: list = []     # generation-time values (numpy order); written leaves: current state

    # -- helpers
    def pick(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def shape(self, max_elems=MAX_ELEMS, min_ne0=1) -> tuple:
        nd = self.draw(st.integers(1, 4))
        ne = [1, 1, 1, 1]
        for k in range(nd):
            ne[k] = self.pick([s for s in SIZES if s * nelements(ne) <= max_elems and (k or s >= min_ne0)] or [1])
        return tuple(ne)

    def repeat_of(self, ne) -> tuple:
        """A shape that ggml-repeats over ne (each dim 1, all of it, or a divisor)."""
        return tuple(self.pick(sorted({1, n} | {d for d in range(2, n) if n % d == 0})) for n in ne)

    def add_item(self, it: Item, value=None) -> int:
        self.items.append(it)
        i = len(self.items) - 1
        if it.op is None:
            value = stored(leaf_values(self.seed, i, it), it.dtype)
        elif it.op in VIEW_OPS or it.op in WRITE_OPS:
            value = None
        self.vals.append(value)
        return i

    def value(self, i: int) -> np.ndarray:
        it = self.items[i]
        root = self.vals[it.root]
        return root.reshape(-1)[positions(it)] if it.root != i else root

    def leaf(self, ne, dtype, kind="normal", params=(), persistent=False) -> int:
        return self.add_item(Item(None, (), params, tuple(ne), dtype, len(self.items), contiguous(ne),
                                  kind=kind, persistent=persistent, stateful=persistent, neg_inf=kind == "mask"))

    def node(self, op, srcs, params, ne, dtype, **flags) -> int:
        """An op node that is its own root; its value is computed and range-checked here."""
        i = len(self.items)
        it = Item(op, tuple(srcs), tuple(params), tuple(ne), dtype, i, contiguous(ne),
                  neg_inf=flags.get("neg_inf", False),
                  stateful=any(self.items[s].stateful for s in srcs))
        with np.errstate(all="ignore"):   # a non-finite result is rejected just below
            v = apply(op, it.params, [self.value(s) for s in srcs], it)
        if dtype is not I32:
            v = stored(v, dtype)
            fin = v[np.isfinite(v)]
            if np.isnan(v).any() or np.isposinf(v).any() or (np.isneginf(v).any() and not it.neg_inf):
                raise Reject(f"{op}: non-finite values")
            if fin.size and np.abs(fin).max() > MAX_ABS:
                raise Reject(f"{op}: values beyond {MAX_ABS}")
        return self.add_item(it, v)

    def view(self, op, src, ne, nb, offs, params=()) -> int:
        s = self.items[src]
        return self.add_item(Item(op, (src,), tuple(params), tuple(ne), s.dtype, s.root, tuple(nb), offs,
                                  neg_inf=s.neg_inf, stateful=s.stateful))

    def candidate(self, floats=True, finite=True, fresh=0.25, stateless=False, ok=lambda it: True):
        """An existing item (recent ones more likely) or None (then the caller makes a new leaf)."""
        pool = [i for i, it in enumerate(self.items)
                if (it.dtype in FLOATS if floats else it.dtype is I32) and (not finite or not it.neg_inf)
                and (not stateless or not it.stateful) and it.kind not in ("pos", "idx", "rows") and ok(it)]
        if not pool or self.draw(st.floats(0, 1)) < fresh:
            return None
        return pool[-1 - self.draw(st.integers(0, len(pool) - 1))]

    def operand(self, finite=True, stateless=False, dtypes=FLOATS, ok=lambda it: True) -> int:
        i = self.candidate(finite=finite, stateless=stateless, ok=lambda it: it.dtype in dtypes and ok(it))
        if i is None:
            ne = self.shape()
            if not ok(Item(None, (), (), ne, dtypes[0], 0, contiguous(ne))):
                raise Reject("no operand fits")
            i = self.leaf(ne, self.pick(dtypes))
        return i

    # -- ops
    def op(self, name: str) -> None:
        getattr(self, "_" + name, self._unary)(name)

    def _binary(self, name):
        a = self.operand(finite=name in ("mul", "div"))
        A = self.items[a]
        if name == "div":   # divisors are leaves with |x| >= 0.5 (values near 0 are ill-conditioned)
            b = self.leaf(self.repeat_of(A.ne), self.pick(FLOATS), kind="away0")
        else:
            b = self.candidate(finite=name == "mul" or A.neg_inf or name == "sub",
                               ok=lambda it: all(x % y == 0 for x, y in zip(A.ne, it.ne)))
            if b is None:
                b = self.leaf(self.repeat_of(A.ne), self.pick(FLOATS))
        self.node(name, (a, b), (), A.ne, A.dtype, neg_inf=A.neg_inf or self.items[b].neg_inf)

    _add = _sub = _mul = _div = _binary

    def _unary(self, name):
        a = self.operand()
        A = self.items[a]
        params = {"scale": lambda: (self.pick([0.5, -1.5, 2.0, 0.125, -0.7, 3.0]),),
                  "rms_norm": lambda: (self.pick([1e-6, 1e-5]),), "norm": lambda: (self.pick([1e-6, 1e-5]),),
                  }.get(name, lambda: ())()
        self.node(name, (a,), params, A.ne, A.dtype)

    def _cont(self, name):
        a = self.operand(finite=False)
        self.node("cont", (a,), (), self.items[a].ne, self.items[a].dtype, neg_inf=self.items[a].neg_inf)

    def _cast(self, name):
        a = self.operand(finite=False)
        A = self.items[a]
        if "fused_cast_of_reshape" in KNOWN_BUGS and A.op == "reshape" and self.items[A.root].op is not None:
            raise Reject("known bug: cast of a reshape of an op node")
        dt = self.pick(FLOATS)
        self.node("cast", (a,), (dt,), A.ne, dt, neg_inf=A.neg_inf)

    def _argmax(self, name):
        a = self.operand(finite=False)
        A = self.items[a]
        self.node("argmax", (a,), (), (1,) + A.ne[1:], I32)

    def _soft_max(self, name):
        a = self.operand(finite=False, dtypes=(F32,))
        A = self.items[a]
        params, srcs, neg = (), (a,), False
        if name == "soft_max_ext":
            s = self.pick([1.0, 0.5, 0.125, 2.0])
            bias = self.pick([0.0, 0.0, 8.0])
            mask = None
            if bias or self.draw(st.booleans()):
                mask = self.candidate(finite=False, fresh=0.5, ok=lambda it: it.dtype in (F32, F16) and
                                      it.ne[0] == A.ne[0] and it.ne[1] >= A.ne[1] and A.ne[2] % it.ne[2] == 0
                                      and A.ne[3] % it.ne[3] == 0 and it.nb[0] == 1)
                if mask is None:
                    ne = (A.ne[0], A.ne[1] + self.pick([0, 0, 3]), self.pick([1, A.ne[2]]), self.pick([1, A.ne[3]]))
                    mask = self.leaf(ne, self.pick([F32, F16]), kind="mask")
                srcs = (a, mask)
            params = (s, bias)
            logits = self.value(a) * s
        else:
            logits = self.value(a)
        fin = logits[np.isfinite(logits)]
        if fin.size and np.abs(fin).max() > MAX_LOGIT:
            raise Reject("soft_max: logits too large")
        self.node(name, srcs, params, A.ne, F32, neg_inf=neg)

    _soft_max_ext = _soft_max

    def _diag_mask_inf(self, name):
        a = self.operand()
        A = self.items[a]
        self.node(name, (a,), (self.draw(st.integers(0, A.ne[0])),), A.ne, A.dtype, neg_inf=True)

    def _rope(self, name):
        a = self.operand(dtypes=(F32, F16), ok=lambda it: it.ne[0] >= 2)
        A = self.items[a]
        pos = self.leaf((A.ne[2], 1, 1, 1), I32, kind="pos")
        n_dims = 2 * self.draw(st.integers(1, A.ne[0] // 2))
        params = (n_dims, self.pick([gg.ROPE_NORMAL, gg.ROPE_NEOX]), self.pick([10000.0, 500.0]),
                  self.pick([1.0, 0.5]))
        self.node(name, (a, pos), params, A.ne, A.dtype)

    def _mul_mat(self, name):
        if self.draw(st.booleans()):   # an existing a (weights, a cache view), a new b
            a = self.operand()
            A = self.items[a]
            n = self.pick([s for s in SIZES if s * A.ne[0] * A.ne[2] * A.ne[3] <= MAX_ELEMS] or [1])
            ne_b = (A.ne[0], n, A.ne[2] * self.pick([1, 1, 2, 3]), A.ne[3] * self.pick([1, 1, 2]))
            if nelements(ne_b) > MAX_ELEMS:
                ne_b = (A.ne[0], n, A.ne[2], A.ne[3])
            b = self.leaf(ne_b, self.pick(FLOATS))
        else:                          # an existing b (activations), new weights of magnitude 1/sqrt(K)
            quantized = self.draw(st.floats(0, 1)) < self.quant  # weights of QUANTS: F32 b, K = 32k
            if quantized:
                b = self.candidate(ok=lambda it: it.dtype is F32 and it.ne[0] % 32 == 0)
                if b is None:
                    b = self.leaf((self.pick([32, 64, 96]), self.pick([1, 1, 2, 3, 5]), self.pick([1, 2]), 1), F32)
            else:
                b = self.operand()
            B = self.items[b]
            m = self.pick([s for s in SIZES if s * B.ne[0] <= MAX_ELEMS])
            div2 = self.pick([d for d in range(1, B.ne[2] + 1) if B.ne[2] % d == 0])
            div3 = self.pick([d for d in range(1, B.ne[3] + 1) if B.ne[3] % d == 0])
            dt = self.pick(QUANTS) if quantized else self.pick(FLOATS)
            a = self.leaf((B.ne[0], m, div2, div3), dt, params=(float(1 / np.sqrt(B.ne[0])),))
        A, B = self.items[a], self.items[b]
        ne = (A.ne[1], B.ne[1], B.ne[2], B.ne[3])
        if nelements(ne) > MAX_ELEMS or nelements(ne) * A.ne[0] > 2 ** 17:
            raise Reject("mul_mat: too big")
        self.node(name, (a, b), (), ne, F32)

    def _get_rows(self, name):
        a = self.operand(finite=False, ok=lambda it: it.ne[2] * it.ne[3] <= 64)
        A = self.items[a]
        n = self.pick([1, 2, 3, 5, 8])
        if nelements((A.ne[0], n, A.ne[2], A.ne[3])) > MAX_ELEMS:
            raise Reject("get_rows: too big")
        idx = self.leaf((n, A.ne[2], A.ne[3], 1), I32, kind="idx", params=(A.ne[1],))
        self.node(name, (a, idx), (), (A.ne[0], n, A.ne[2], A.ne[3]), F32, neg_inf=A.neg_inf)

    def _write(self, op, dst, src, idx=None) -> int:
        """cpy / set_rows node: writes into dst's root (a persistent leaf) now, in generation order."""
        D = self.items[dst]
        i = len(self.items)
        srcs = (src, dst) if op == "cpy" else (dst, src, idx)
        self.items.append(Item(op, srcs, (), D.ne, D.dtype, D.root, D.nb, D.offs, stateful=True))
        self.vals.append(None)
        state = self.vals[D.root].reshape(-1)
        if op == "cpy":
            state[positions(D).reshape(-1)] = stored(self.value(src), D.dtype).reshape(-1)
        else:
            pos, v, ix = positions(D), stored(self.value(src), D.dtype), self.value(idx)[0]
            for k3 in range(v.shape[0]):
                for k2 in range(v.shape[1]):
                    for j in range(v.shape[2]):
                        state[pos[k3, k2, int(ix[k3 % ix.shape[0], k2 % ix.shape[1], j])]] = v[k3, k2, j]
        return i

    def _cache(self, ne) -> int:
        """A written leaf with at least nelements(ne) elements: an existing one or a new one."""
        n = nelements(ne)
        old = [i for i, it in enumerate(self.items) if it.persistent and nelements(it.ne) >= n]
        if old and self.draw(st.booleans()):
            return self.pick(old)
        extra = tuple(self.pick([0, 0, 1, 2]) for _ in range(4))
        big = tuple(x + e for x, e in zip(ne, extra))
        if nelements(big) > 4 * MAX_ELEMS:
            big = ne
        return self.leaf(big, self.pick(FLOATS), persistent=True)

    def _cpy(self, name):
        a = self.operand(stateless=True)
        A = self.items[a]
        kind = self.pick(["region", "flat", "fresh"])
        if kind == "fresh":   # ggml's cpy into a new tensor (a cast)
            p = dst = self.leaf(A.ne, self.pick(FLOATS), kind="fresh", persistent=True)
        else:
            p = self._cache(A.ne)
            P = self.items[p]
            if kind == "region" and all(x >= y for x, y in zip(P.ne, A.ne)):
                start = [self.draw(st.integers(0, x - y)) for x, y in zip(P.ne, A.ne)]
                offs = sum(s * b for s, b in zip(start, P.nb))
                dst = self.view("view_4d", p, A.ne, P.nb, offs)
            else:
                n = nelements(A.ne)
                offs = self.draw(st.integers(0, nelements(P.ne) - n))
                dst = self.view("view_1d", p, (n, 1, 1, 1), (1, n, n, n), offs)
        self._write("cpy", dst, a)
        if self.draw(st.booleans()):   # a later reader of the cache: the region written, or all of it
            self._reader(p if dst == p or self.draw(st.booleans()) else dst)

    def _reader(self, r) -> None:
        """An op reading item r (a cache); rejected quietly (the write before it stays)."""
        mark = len(self.items)
        op = self.pick(["scale", "silu", "cont", "rms_norm"])
        R = self.items[r]
        try:
            self.node(op, (r,), {"scale": (0.5,), "rms_norm": (1e-5,)}.get(op, ()), R.ne, R.dtype)
        except Reject:
            del self.items[mark:], self.vals[mark:]

    def _set_rows(self, name):
        src = self.operand(stateless=True, ok=lambda it: it.ne[2] * it.ne[3] <= 64)
        S = self.items[src]
        n_rows = S.ne[1] + self.pick([0, 1, 3, 8])
        ne = (S.ne[0], n_rows, S.ne[2], S.ne[3])
        old = [i for i, it in enumerate(self.items) if it.persistent and it.root == i and it.ne == ne]
        dst = self.pick(old) if old and self.draw(st.booleans()) else self.leaf(ne, self.pick(FLOATS), persistent=True)
        idx = self.leaf((S.ne[1], S.ne[2], S.ne[3], 1), I32, kind="rows", params=(n_rows,))
        self._write("set_rows", dst, src, idx)
        if self.draw(st.booleans()):
            self._reader(dst)

    # -- views
    def _contiguous_operand(self):
        return self.operand(finite=False, ok=is_contiguous)

    def _view_1d(self, name):
        s = self._contiguous_operand()
        S = self.items[s]
        n = nelements(S.ne)
        start = self.draw(st.integers(0, n - 1))
        cnt = self.draw(st.integers(1, n - start))
        self.view(name, s, (cnt, 1, 1, 1), (1, cnt, cnt, cnt), S.offs + start)

    def _view_nd(self, name):
        """k dims strided within a contiguous source (start, count, step per dim; dims >= k pick one
        slice), or rows packed over its flat elements (view_2d with nb1 = ne0)."""
        k = int(name[-2])
        s = self._contiguous_operand()
        S = self.items[s]
        nb_s = contiguous(S.ne)
        if k == 2 and self.draw(st.integers(0, 3)) == 0:   # reinterpret the flat elements as rows
            n = nelements(S.ne)
            ne0 = self.draw(st.integers(1, n))
            ne1 = self.draw(st.integers(1, n // ne0))
            offs = self.draw(st.integers(0, n - ne0 * ne1))
            self.view(name, s, (ne0, ne1, 1, 1), (1, ne0, ne0 * ne1, ne0 * ne1), S.offs + offs)
            return
        ne, nb, offs = [1, 1, 1, 1], [1, 1, 1, 1], S.offs
        for d in range(4):
            if d < k:
                step = 1 if d == 0 else self.pick([1, 1, 2])
                cnt = self.draw(st.integers(1, (S.ne[d] - 1) // step + 1))
                start = self.draw(st.integers(0, S.ne[d] - 1 - (cnt - 1) * step))
                ne[d], nb[d] = cnt, nb_s[d] * step
            else:
                start = self.draw(st.integers(0, S.ne[d] - 1))
                nb[d] = nb[d - 1] * ne[d - 1]     # unused (ne 1): gg's default strides
            offs += start * nb_s[d]
        if k < 4:   # gg fills the strides of dims >= k contiguously from the given ones
            for d in range(k, 4):
                nb[d] = nb[d - 1] * ne[d - 1]
        self.view(name, s, tuple(ne), tuple(nb), offs)

    _view_2d = _view_3d = _view_4d = _view_nd

    def _reshape(self, name):
        s = self._contiguous_operand()
        S = self.items[s]
        n = nelements(S.ne)
        options = [(n, 1, 1, 1), (S.ne[0] * S.ne[1], S.ne[2], S.ne[3], 1), (S.ne[0], S.ne[1] * S.ne[2], S.ne[3], 1),
                   (1, n, 1, 1), tuple(S.ne[::-1])]
        d = [x for x in range(2, n) if n % x == 0]
        if d:
            x = self.pick(d)
            options.append((x, n // x, 1, 1))
        ne = self.pick(options)
        self.view(name, s, ne, contiguous(ne), S.offs, params=ne)

    def _permute(self, name):
        s = self.operand(finite=False)
        S = self.items[s]
        axes = (1, 0, 2, 3) if name == "transpose" else tuple(self.draw(st.permutations(range(4))))
        ne, nb = [0] * 4, [0] * 4
        for i, ax in enumerate(axes):   # ggml: source dim i goes to position ax_i
            ne[ax], nb[ax] = S.ne[i], S.nb[i]
        self.view(name, s, tuple(ne), tuple(nb), S.offs, params=() if name == "transpose" else axes)

    _transpose = _permute


@st.composite
def programs(draw, min_ops: int = 2, max_ops: int = 30, ops=ALL_OPS, max_graphs: int = 3, keep_ok: bool = True,
             quant: float = 0.15):
    """A random Program: 2-30 op nodes over random leaves, 1-3 graphs over them, a compute order;
    `quant` of the products with new weights get quantized ones."""
    gen = _Gen(draw, draw(st.integers(0, 2 ** 31 - 1)), quant)
    n_ops = draw(st.integers(min_ops, max_ops))
    tries = 0
    while sum(it.op is not None for it in gen.items) < n_ops and tries < 4 * max_ops:
        tries += 1
        mark = len(gen.items)
        try:
            gen.op(draw(st.sampled_from(ops)))
        except Reject:   # (raised before any write into a leaf: writes come last in an op's draw)
            del gen.items[mark:], gen.vals[mark:]
    items = gen.items
    ops_at = [i for i, it in enumerate(items) if it.op is not None]
    if not ops_at:
        gen.node("cont", (gen.leaf((3, 1, 1, 1), F32),), (), (3, 1, 1, 1), F32)
        ops_at = [len(items) - 1]
    used = {s for it in items for s in it.srcs}
    sinks = [i for i in ops_at if i not in used]
    n_graphs = draw(st.integers(1, max_graphs))
    outs = [[] for _ in range(n_graphs)]
    kept = [[] for _ in range(n_graphs)]
    for i in ops_at:   # every sink is an output; other nodes sometimes (an output read mid-graph)
        if i in sinks or draw(st.integers(0, 4)) == 0:
            for g in {draw(st.integers(0, n_graphs - 1)) for _ in range(draw(st.sampled_from([1, 1, 1, 2])))}:
                outs[g].append(i)
    for g in range(n_graphs):
        if not outs[g]:
            outs[g].append(draw(st.sampled_from(ops_at)))
        if keep_ok:
            inside = [i for i in build_order(Program(0, items, [], ()), outs[g])
                      if items[i].op not in (None, *VIEW_OPS, *WRITE_OPS) and i not in outs[g]]
            if inside and draw(st.integers(0, 3)) == 0:
                kept[g].append(draw(st.sampled_from(inside)))
    order = list(draw(st.permutations(range(n_graphs))))
    order += draw(st.lists(st.integers(0, n_graphs - 1), max_size=3))
    return Program(gen.seed, items, [(tuple(o), tuple(k)) for o, k in zip(outs, kept)], tuple(order))


# ---- building with gg and checking ---------------------------------------------------------------------

def build(prog: Program, ctx) -> list:
    """gg tensors for every item, through the public API; checks gg's ne/nb/dtype against the model."""
    ts: list = []
    for i, it in enumerate(prog.items):
        src = [ts[s] for s in it.srcs]
        if it.op is None:
            if it.kind == "fresh":
                t = ctx.new_tensor(it.dtype, it.ne)
            elif it.persistent:
                t = ctx.new_tensor(it.dtype, it.ne, persistent=True)
                t.set(leaf_values(prog.seed, i, it))
            elif it.dtype in QUANTS:
                t = ctx.tensor_from_bytes(quantized_bytes(leaf_values(prog.seed, i, it), it.dtype), it.dtype, it.ne)
                COUNTS["quantized_weights"] += 1
            else:
                t = ctx.tensor(leaf_values(prog.seed, i, it), dtype=it.dtype)
        elif it.op in VIEW_OPS:
            S = prog.items[it.srcs[0]]
            size = it.dtype.size
            off = (it.offs - S.offs) * size
            nb = [b * size for b in it.nb]
            t = {"view_1d": lambda: gg.view_1d(src[0], it.ne[0], off),
                 "view_2d": lambda: gg.view_2d(src[0], it.ne[0], it.ne[1], nb[1], off),
                 "view_3d": lambda: gg.view_3d(src[0], *it.ne[:3], nb[1], nb[2], off),
                 "view_4d": lambda: gg.view_4d(src[0], *it.ne, *nb[1:], off),
                 "reshape": lambda: gg.reshape(src[0], *it.params),
                 "permute": lambda: gg.permute(src[0], *it.params),
                 "transpose": lambda: gg.transpose(src[0])}[it.op]()
        elif it.op == "cast":
            t = gg.cast(src[0], it.params[0])
        elif it.op == "soft_max_ext":
            t = gg.soft_max_ext(src[0], src[1] if len(src) > 1 else None, scale=it.params[0], max_bias=it.params[1])
        else:
            t = getattr(gg, it.op)(*src, *it.params)
        bs = it.dtype.block_size  # a block type's nb counts blocks (nb[0]: one block's bytes)
        want_nb = tuple(max(1, b // bs) * it.dtype.size if k == 0 else b // bs * it.dtype.size
                        for k, b in enumerate(it.nb))
        assert (t.ne, t.dtype) == (it.ne, it.dtype), f"#{i} {it.op}: gg made ne={t.ne} {t.dtype.name}, model {it.ne} {it.dtype.name}"
        assert all(a == b for a, b, n in zip(t.nb, want_nb, it.ne) if n > 1), \
            f"#{i} {it.op}: gg nb={t.nb}, model {want_nb}"   # (the stride of a dim of 1 does not matter)
        ts.append(t)
    return ts


class Reference:
    """The float64 replay of a program and its perturbed replays (the conditioning probe)."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.exact = Evaluation(prog)
        self.noisy = [Evaluation(prog, noise=prog.seed + k + 1) for k in range(PERTURBATIONS)]
        self.tol = path_tolerance(prog)

    def expected(self, step: int, key):
        return self.exact.steps[step][key], [e.steps[step][key] for e in self.noisy]


def compare(actual, ref, noisy, tol: float, what: str) -> float | None:
    """Check one value; returns its NMSE (None: ill-conditioned, not compared)."""
    actual = np.asarray(actual)
    assert actual.size == ref.size, f"{what}: {actual.shape} vs reference {ref.shape}"
    actual = actual.reshape(ref.shape)
    if ref.dtype.kind in "iu":   # argmax: the rows where the perturbed references agree, exactly
        stable = np.all([n == ref for n in noisy], axis=0)
        COUNTS["rows_unstable"] += int((~stable).sum())
        bad = stable & (actual != ref)
        assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} indices differ, e.g. {actual[bad][:5]} vs {ref[bad][:5]}"
        return 0.0
    spread = max([nmse(n, ref) for n in noisy] + [0.0])
    if spread > ILL_CONDITIONED:
        COUNTS["skipped"] += 1
        return None
    limit = max(tol, 4 * spread)
    err = nmse(actual, ref)
    assert err <= limit, (f"{what}: NMSE {err:.3e} > limit {limit:.1e} (path threshold {tol:.0e}, perturbation "
                          f"{spread:.1e}); max |diff| {np.nanmax(np.abs(actual.astype(np.float64) - ref)):.3e}")
    COUNTS["compared"] += 1
    return err


def execute(prog: Program, ref: Reference, backends, fuse: bool = True, read_intermediates: bool = True) -> dict:
    """Build the program in a fresh context, compute its graphs in the scheduled order and check every
    readable value after each compute: outputs and kept tensors of every graph computed so far (A's
    outputs must still hold what A computed after B ran), the written leaves, and (right or refused)
    one intermediate. Returns the last values read (numpy) by item."""
    ctx = gg.Context()
    ts = build(prog, ctx)
    graphs = []
    for outs, kept in prog.graphs:
        kw = {"keep": [ts[k] for k in kept]} if kept else {}
        graphs.append(gg.build_forward(*[ts[o] for o in outs], backends=backends, fuse=fuse, **kw))
    seen: dict = {}
    for step, g in enumerate(prog.schedule):
        graphs[g].compute()
        COUNTS["graphs"] += 1
        for key in ref.exact.steps[step]:
            if key in ref.exact.stale[step] and "view_output_reads_latest_root" in KNOWN_BUGS:
                COUNTS["known_bug_skips"] += 1
                continue
            if isinstance(key, tuple):   # a written leaf
                i = key[1]
                what, got = f"written leaf #{i} after compute {step} (graph {g})", ts[i].numpy()
            else:
                i = key
                what, got = f"#{i} ({prog.items[i].op}) after compute {step} (graph {g})", ts[i].numpy()
            exact, noisy = ref.expected(step, key)
            compare(got, exact, noisy, ref.tol[i], what)
            seen[key] = got
        if read_intermediates:
            _read_an_intermediate(prog, ref, ts, step, g)
    gg.synchronize()
    return seen


def _read_an_intermediate(prog: Program, ref: Reference, ts, step: int, g: int) -> None:
    """An op node of the graph just computed that no graph outputs or keeps: numpy() is right or a
    GGError (DESIGN §1)."""
    # (roots of a view some graph outputs or keeps are left out: which compute's value they hold is
    # not defined by DESIGN)
    readable = {prog.items[o].root for outs, kept in prog.graphs for o in outs + kept}
    inside = [i for i in build_order(prog, prog.graphs[g][0])
              if prog.items[i].op not in (None, *VIEW_OPS, *WRITE_OPS) and i not in readable
              and prog.items[i].root == i]
    if not inside:
        return
    i = inside[(prog.seed + step) % len(inside)]
    try:
        got = ts[i].numpy()
    except gg.GGError:
        COUNTS["intermediates_refused"] += 1
        return
    exact = _value_in_compute(prog, step, i, None)
    noisy = [_value_in_compute(prog, step, i, prog.seed + k + 1) for k in range(PERTURBATIONS)]
    compare(got, exact, noisy, ref.tol[i], f"intermediate #{i} ({prog.items[i].op}) read after compute {step}")
    COUNTS["intermediates_read"] += 1


def _value_in_compute(prog: Program, step: int, i: int, noise) -> np.ndarray:
    """Item i's value in compute `step` of the schedule (a replay that also keeps i)."""
    outs, kept = prog.graphs[prog.schedule[step]]
    extra = Program(prog.seed, prog.items, [(o, k + (i,)) if n == prog.schedule[step] else (o, k)
                                            for n, (o, k) in enumerate(prog.graphs)], prog.schedule[:step + 1])
    return Evaluation(extra, noise).steps[step][i]
