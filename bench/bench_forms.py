"""The llama decode block in many equivalent forms (issue 20, "fast on any graph"): each form's time
next to the best form's and the bytes floor, with PyTorch side by side.

    PYTHONPATH=. python bench/bench_forms.py [--n-head-kv 8] [--steps 50] [--json out.json] [--const FAMILY.NAME=N]
    PYTHONPATH=. python bench/bench_forms.py --backend cpu --small          # logic check, no GPU

The forms (tests/forms.py FORMS): gg.llama's own attention_block (stacked wqkv, V cache transposed,
reusable indexed graph), and the block written by hand the way llama.cpp does (separate Wq/Wk/Wv,
rope NEOX, K and V both position-major per head and written with cpy into views, V read as
transpose(view), mask input + soft_max_ext) and its variants: V through cont(transpose(V)), an F16
mask, rope NORMAL + scale/diag_mask_inf/soft_max, residual add(Wo·a, x), set_rows with an I32 row
input, GQA (n_head/4 KV heads), MQA, Q8_0 weights; and full layers (attention + SwiGLU FFN) of both builders.

Sets (one table each):
- attention: llama-7B dims (n_embd 4096, 32 heads, n_head_kv 32 or --n-head-kv, head_dim 128),
  F16 weights and cache, n_ctx 4096, one token at n_past 4095;
- layer: the same dims + FFN (n_ff 11008, or 14336 with 8 KV heads: llama-3-8B);
- smol layer: SmolLM2-135M dims (n_embd 576, 9 heads, 3 KV heads, head_dim 64, n_ff 1536),
  n_ctx 256 at n_past 255 (llama-bench's tg128 sees a short context); launch-bound, so the table
  also gives the 30-layer tokens/s this layer time allows.

Columns: `steps` in the plan; `us` device-bound time per compute (time_gg: computes enqueued back
to back); `host us` what one compute() costs the Python thread; `vs best` time / the best form's
among forms that must read the same bytes (same KV heads and weight type); `MiB` the bytes the
step must read (weight matrices and norms, the n_past + 1 valid K and V rows, x); `floor us` those
bytes at the measured copy bandwidth; `vs floor` time / floor. Torch rows: the same block in
PyTorch (F16 weights and cache, softmax in F32), eager and captured in a CUDA graph (--torch-compile
adds torch.compile); their `vs best` compares with the best gg form of the set.

Correctness guard: before any timing every form's output is compared with a float64 numpy reference
(tests/forms.py `reference`, from the stored weight values) on the block output and on the block
part alone (output - x); NMSE above 1e-3 (or NaN) is a failure: exit status 3, no timings (with
--keep-going the failing forms are left out of the timings and the exit status is still 3)."""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import gg  # noqa: E402
import forms as F  # noqa: E402
from common import copy_roof, dump, time_gg, torch, torch_variants  # noqa: E402

NMSE_LIMIT = 1e-3
SMOL = F.Dims(n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_ctx=256)
SMOL_LAYERS = 30


def nmse(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = float(np.sum((a - ref) ** 2) / max(float(np.sum(ref * ref)), 1e-300))
    return d if math.isfinite(d) and np.all(np.isfinite(a)) else float("nan")


def cpu_copy_roof(nbytes: int = 256 << 20) -> float:
    """copy_roof on gg's CPU backend (for --backend cpu runs only)."""
    n = nbytes // 8
    x = gg.Context().new_tensor(gg.F32, (n,))
    x.set(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    sec, _ = time_gg(gg.build_forward(gg.cont(x), backends=("cpu",)), iters=5)
    return 2 * n * 4 / sec


# ---- the block in PyTorch -------------------------------------------------------------------
class TorchDecode:
    """One decode step of the block in PyTorch on `device`: F16 weights (the stored values) and an
    F16 cache (n_ctx, n_head_kv, head_dim) for K and V, F16 products, softmax in F32."""

    def __init__(self, d: F.Dims, rope_mode: int, w: dict, k_rows, v_rows, x, n_past: int, ffn: bool, device: str):
        self.d, self.n_past, self.ffn = d, n_past, ffn
        t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dt)  # noqa: E731
        self.w = {k: t(a, torch.float32 if k in F.NORMS else torch.float16) for k, a in w.items()}
        self.kc, self.vc = t(k_rows, torch.float16), t(v_rows, torch.float16)
        self.x = t(np.asarray(x)[None, :], torch.float32)
        hd = d.head_dim
        theta = n_past * d.rope_base ** (-2.0 * np.arange(hd // 2) / hd)
        self.cos, self.sin = t(np.cos(theta), torch.float32), t(np.sin(theta), torch.float32)
        self.neox = rope_mode == gg.ROPE_NEOX

    def rope(self, a):
        if self.neox:
            a0, a1 = a.chunk(2, dim=-1)
            return torch.cat((a0 * self.cos - a1 * self.sin, a0 * self.sin + a1 * self.cos), dim=-1)
        a0, a1 = a[..., 0::2], a[..., 1::2]
        return torch.stack((a0 * self.cos - a1 * self.sin, a0 * self.sin + a1 * self.cos), dim=-1).flatten(-2)

    def rms(self, a, w):
        return (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + self.d.eps) * w).half()

    def __call__(self, sdpa: bool = False):
        d, w, n = self.d, self.w, self.n_past
        hd, nh, nkv = d.head_dim, d.n_head, d.n_head_kv
        x = self.x
        h = self.rms(x, w["attn_norm"])
        q = self.rope((h @ w["wq"].T).float().view(nh, hd)).half()
        self.kc[n] = self.rope((h @ w["wk"].T).float().view(nkv, hd)).half()
        self.vc[n] = (h @ w["wv"].T).view(nkv, hd)
        K, V = self.kc[:n + 1].permute(1, 0, 2), self.vc[:n + 1].permute(1, 0, 2)   # (nkv, n_kv, hd)
        if sdpa:
            qs = q.view(nh, 1, hd)[None]
            try:
                o = torch.nn.functional.scaled_dot_product_attention(qs, K[None], V[None], enable_gqa=nkv != nh)
            except TypeError:  # torch < 2.5: no enable_gqa
                g = nh // nkv
                o = torch.nn.functional.scaled_dot_product_attention(
                    qs, K.repeat_interleave(g, 0)[None], V.repeat_interleave(g, 0)[None])
            o = o.reshape(1, d.n_embd)
        else:
            qg = q.view(nkv, nh // nkv, hd)                                        # query heads by KV head
            p = torch.softmax((qg @ K.transpose(1, 2)).float() / math.sqrt(hd), dim=-1).half()
            o = (p @ V).reshape(1, d.n_embd)
        out = x + (o @ w["wo"].T).float()
        if self.ffn:
            g = self.rms(out, w["ffn_norm"])
            a = torch.nn.functional.silu(g @ w["w_gate"].T) * (g @ w["w_up"].T)
            out = out + (a @ w["w_down"].T).float()
        return out


def torch_rows(fn, iters: int, compile_: bool) -> dict[str, float]:
    """eager and CUDA-graph times of fn (+ torch.compile), named without the "torch " prefix."""
    return {k.removeprefix("torch "): v for k, v in torch_variants(fn, iters, compile=compile_).items()}


def torch_group(form: F.Form, base: F.Dims, data: tuple, n_past: int, key: tuple, best: float, roof: float,
                args, tdev: str) -> list[dict]:
    """Torch rows (plain and sdpa attention; eager, CUDA graph) for the block `form` computes."""
    d = form.dims(base)
    arrays, k_rows, v_rows, x = data
    w = {k: arrays[k].astype(np.float16) if k not in F.NORMS else arrays[k] for k in F.weight_shapes(d, form.ffn)}
    tb = TorchDecode(d, gg.ROPE_NEOX, w, k_rows, v_rows, x, n_past, form.ffn, tdev)
    ref = F.reference(d, gg.ROPE_NEOX, {k: a.astype(np.float64) for k, a in w.items()}, k_rows, v_rows,
                      x, n_past, form.ffn)
    nbytes = F.bytes_to_read(d, form, n_past)
    rows = []
    for variant, fn in (("", lambda: tb()), (" sdpa", lambda: tb(sdpa=True))):
        with torch.no_grad():
            err = nmse(fn().cpu().numpy()[0], ref)
            times = torch_rows(fn, args.steps, args.torch_compile)
        print(f"  torch{variant} (kv {key[0]}, ffn {form.ffn}): NMSE vs the float64 reference {err:.1e}")
        for tname, tsec in times.items():
            rows.append(dict(name=f"torch{variant} {tname} (kv {key[0]})", group=key, steps=None, seconds=tsec,
                             host_us=None, bytes=nbytes, floor_seconds=nbytes / roof, vs_best=tsec / best,
                             vs_floor=tsec * roof / nbytes, nmse=err))
    return rows


# ---- one set of forms -------------------------------------------------------------------------
def group_key(form: F.Form, base: F.Dims) -> tuple:
    """Forms that must read the same bytes are compared with each other."""
    return (form.dims(base).n_head_kv, (form.wtype or gg.F16).name, form.ffn)


def run_set(title: str, names: list[str], base: F.Dims, args, backends, roof: float, tdev) -> tuple[dict, bool]:
    n_past = base.n_ctx - 1
    print(f"\n[{title}] {base}, n_past {n_past}")
    data: dict[F.Dims, tuple] = {}
    ffn = any(F.FORMS[n].ffn for n in names)
    rows, failed = [], []
    built: list[tuple[F.Form, F.Built]] = []
    # -- build and guard every form before any timing --
    for name in names:
        form = F.FORMS[name]
        d = form.dims(base)
        if d not in data:
            x = np.random.default_rng(2).standard_normal(d.n_embd, dtype=np.float32)
            data[d] = (F.make_arrays(d, 0, ffn), *F.make_cache_rows(d, 1), x)
        t0 = time.perf_counter()
        b = F.build(form, base, n_past, *data[d], backends=backends)
        n_steps, symbols = F.plan_summary(b.graph)
        t1 = time.perf_counter()
        b.graph.compute()
        got = b.result()
        first = time.perf_counter() - t1
        ref = b.reference()
        x = data[d][3].astype(np.float64)
        e_out, e_blk = nmse(got, ref), nmse(got - x, ref - x)
        ok = e_out <= NMSE_LIMIT and e_blk <= NMSE_LIMIT
        print(f"  {name:22s} {n_steps:3d} steps  NMSE out {e_out:.1e} block {e_blk:.1e}  "
              f"build {t1 - t0:.1f} s, first compute {first:.1f} s{'' if ok else '  FAILED'}")
        if args.plan:
            print(b.graph.plan)
        if not ok:
            failed.append(name)
            b.free()
            continue
        built.append((form, b))
    if failed:
        print(f"bench_forms: {title}: output does not match the float64 reference (NMSE > {NMSE_LIMIT:g}): "
              f"{', '.join(failed)}", file=sys.stderr)
        if not args.keep_going:
            sys.exit(3)

    # -- timing --
    for form, b in built:
        sec, host = time_gg(b.graph, args.steps)
        nbytes = F.bytes_to_read(b.dims, form, n_past)
        n_steps, symbols = F.plan_summary(b.graph)
        rows.append(dict(name=form.name, group=group_key(form, base), steps=n_steps, seconds=sec, host_us=host * 1e6,
                         bytes=nbytes, floor_seconds=nbytes / roof, kernels=list(symbols),
                         plan=b.graph.plan.summary(), doc=form.doc))
        if args.profile:
            print(b.graph.profile())
        b.free()
        del b
        gc.collect()
    best: dict[tuple, float] = {}
    for r in rows:
        best[r["group"]] = min(best.get(r["group"], math.inf), r["seconds"])
    for r in rows:
        r["vs_best"] = r["seconds"] / best[r["group"]]
        r["vs_floor"] = r["seconds"] / r["floor_seconds"]

    # -- torch, one row set per group that has F16 weights --
    if tdev is not None:
        for key in sorted({r["group"] for r in rows}):
            form = next(F.FORMS[r["name"]] for r in rows if r["group"] == key)
            if key[1] != gg.F16.name:
                continue
            try:
                rows += torch_group(form, base, data[form.dims(base)], n_past, key, best[key], roof, args, tdev)
            except Exception as e:  # noqa: BLE001 - the gg rows stand without torch's
                print(f"  (torch rows for kv {key[0]} failed: {type(e).__name__}: {str(e)[:300]})")
    head = (f"\n{title}: n_embd {base.n_embd}, heads {base.n_head}/{base.n_head_kv} kv (per form), head_dim "
            f"{base.head_dim}, n_ff {base.n_ff}, n_ctx {base.n_ctx}, n_past {n_past}; copy roof {roof / 1e9:.0f} GB/s")
    print(format_table(head, rows))
    if title.startswith("smol"):
        for r in rows:
            if r["steps"] is not None:
                print(f"  {r['name']:22s} {SMOL_LAYERS} layers: {1 / (SMOL_LAYERS * r['seconds']):,.0f} tokens/s "
                      f"(layers alone: no embedding, head or sampling)")
    return {"set": title, "dims": vars(base), "n_past": n_past, "failed": failed, "rows": rows}, not failed


def format_table(title: str, rows: list[dict]) -> str:
    cols = ("form", "steps", "us", "host us", "vs best", "MiB", "floor us", "vs floor")
    fmt = "{:<30s}" + "{:>10s}" * (len(cols) - 1)
    lines = [title, fmt.format(*cols)]
    for r in rows:
        lines.append(fmt.format(
            r["name"][:30], "" if r["steps"] is None else str(r["steps"]), f"{r['seconds'] * 1e6:.1f}",
            "" if r["host_us"] is None else f"{r['host_us']:.1f}", f"{r['vs_best']:.2f}",
            f"{r['bytes'] / 2**20:.1f}", f"{r['floor_seconds'] * 1e6:.1f}", f"{r['vs_floor']:.2f}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                   help="gg backend (cuda: priority ('cuda', 'cpu'); cpu: the numpy backend, logic check)")
    p.add_argument("--small", action="store_true", help="small dims (n_embd 512, 8 heads, n_ctx 512, n_ff 1024)")
    p.add_argument("--n-head-kv", type=int, default=None, help="K/V heads of the base forms (default n_head)")
    p.add_argument("--n-ff", type=int, default=None, help="FFN width (default 11008; 14336 with 8 KV heads)")
    p.add_argument("--n-ctx", type=int, default=None, help="cache positions (decode at n_past = n_ctx - 1)")
    p.add_argument("--sets", default="attention,layer,smol", help="comma-separated: attention, layer, smol")
    p.add_argument("--only", default="", help="comma-separated form names (default: all of each set)")
    p.add_argument("--steps", type=int, default=50, help="timed computes per row")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    p.add_argument("--torch-compile", action="store_true", help="add torch.compile rows (slow to compile)")
    p.add_argument("--keep-going", action="store_true", help="time the forms that pass the guard (exit 3 still)")
    p.add_argument("--profile", action="store_true", help="print graph.profile() per form")
    p.add_argument("--plan", action="store_true", help="print each form's plan")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--const", action="append", default=[], metavar="FAMILY.NAME=N",
                   help="an A/B switch: a CUDA family constant and its NVRTC define (scripts/plan_consts.py)")
    args = p.parse_args(argv)
    if args.const:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
        import plan_consts
        plan_consts.apply(args.const)

    if args.backend == "cuda" and not gg.backends.base.available("cuda"):
        print("bench_forms: no CUDA GPU here (use --backend cpu --small for a logic check)", file=sys.stderr)
        return 2
    backends = ("cuda", "cpu") if args.backend == "cuda" else ("cpu",)
    e, nh, n_ctx = (512, 8, 512) if args.small else (4096, 32, 4096)
    nkv = args.n_head_kv or nh
    n_ff = args.n_ff or (1024 if args.small else 14336 if nkv == 8 else 11008)
    base = F.Dims(n_embd=e, n_head=nh, n_head_kv=nkv, n_ff=n_ff, n_ctx=args.n_ctx or n_ctx)
    tdev = None
    if torch is not None and not args.no_torch and args.backend == "cuda":
        tdev = "cuda"
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in F.FORMS]
    if unknown:
        p.error(f"unknown forms {unknown} (forms: {', '.join(F.FORMS)})")
    sets = {"attention": ("attention", F.ATTENTION_FORMS, base), "layer": ("layer", F.LAYER_FORMS, base),
            "smol": ("smol layer (SmolLM2-135M dims)", F.LAYER_FORMS, SMOL)}
    chosen = [s for s in args.sets.split(",") if s]
    for s in chosen:
        if s not in sets:
            p.error(f"unknown set {s!r} (sets: {', '.join(sets)})")

    print(f"torch: {torch.__version__ + ' on cuda' if tdev else 'not used (rows skipped)'}")
    roof = copy_roof(1 << 30) if args.backend == "cuda" else cpu_copy_roof()
    print(f"copy roof (gg cont, {args.backend}): {roof / 1e9:.0f} GB/s")
    results = {"backend": args.backend, "torch": torch.__version__ if tdev else None,
               "copy_roof_gbps": roof / 1e9, "nmse_limit": NMSE_LIMIT, "sets": []}
    ok = True
    for s in chosen:
        title, names, dims = sets[s]
        names = [n for n in names if not only or n in only]
        if not names:
            continue
        res, passed = run_set(title, names, dims, args, backends, roof, tdev)
        ok = ok and passed
        results["sets"].append(res)
        dump(args.json, results)  # partial results survive a later failure
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
