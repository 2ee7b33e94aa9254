"""Command line: `python -m gg demo | run | bench | kernels | info`."""
from __future__ import annotations

import argparse
import importlib
import sys
import time

USAGE = """usage: python -m gg <command> [options]

commands:
  demo       run the llama attention/transformer block (prefill + decode) on the best backend,
             print the fused plan, check it against a float64 numpy model, print tokens/s
  run        generate text with a real model (a GGUF file; needs `pip install -e '.[models]'`)
  bench      time a real model's prefill and decode (tokens/s)
  kernels    compile every CUDA kernel variant with NVRTC (no GPU needed): --arch sm_80|sm_90|...
  info       what this machine offers (backends, GPU, why CUDA is not usable, NVRTC)

`python -m gg <command> --help` for a command's options."""

# What `pip install -e '.[models]'` brings; an ImportError naming one of these is a missing extra.
_MODEL_PACKAGES = ("gguf", "tokenizers", "jinja2", "safetensors")


def _kernels(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gg kernels", description=(
        "Compile every CUDA kernel variant with NVRTC (no GPU needed) and list each kernel's own "
        "code size (its .text section in the CUBIN)."))
    p.add_argument("--arch", default=None, help="target, e.g. sm_90 (default: this GPU's, else sm_90)")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-kernel lines, only progress and the total")
    args = p.parse_args(argv)
    try:
        from .backends.cuda import catalog
    except ImportError as e:
        print(f"kernels: the CUDA backend cannot be loaded: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def progress(file: str, i: int, n: int) -> None:
        # stderr, flushed: a cold build takes tens of seconds and stdout may be a pipe
        print(f"[{i + 1}/{n}] compiling {file} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    results = catalog.compile_all(args.arch, progress)
    arch = results[0].arch if results else args.arch
    bad = 0
    if not args.quiet and results:
        print(f"{'kernel':48s} {'arch':7s} {'code':>10s}  {'file':12s} status")
    for v, r in zip(catalog.variants(), results):
        if not args.quiet:
            print(f"{r.name:48s} {r.arch:7s} {r.code_bytes:8d} B  {v.file:12s} {'ok' if r.ok else 'ERROR'}")
        if not r.ok:
            bad += 1
            print(f"{r.name}: " + str(r.error).replace("\n", "\n    "), file=sys.stderr)
    print(f"{len(results) - bad}/{len(results)} kernels compiled for {arch} "
          f"from {len(catalog.files())} files in {time.perf_counter() - t0:.1f} s")
    return 1 if bad or not results else 0


def _cuda_why(backend: object | None, reason: str) -> str:
    """Why CUDA cannot run here, in the user's terms, then the raw reason."""
    if backend is None:
        return f"the CUDA backend could not be loaded ({reason})"
    if not getattr(backend, "installed", True):
        return f"cuda-python is not installed: pip install -e '.[cuda]' ({reason})"
    low = reason.lower()
    if "no_device" in low or "no cuda device" in low:
        return f"the NVIDIA driver is installed but sees no GPU ({reason})"
    if "nvrtc" in low:
        return f"NVRTC is missing or broken ({reason})"
    if "driver" in low or "libcuda" in low or "insufficient" in low:
        return f"no usable NVIDIA driver (libcuda) on this machine ({reason})"
    return reason or "unknown reason"


def _nvrtc_line() -> str:
    try:
        from .backends.cuda import compiler
        major, minor = compiler.nvrtc_version()
        archs = compiler.supported_archs()
    except Exception as e:  # noqa: BLE001 - report, don't crash
        return f"not usable ({e}); pip install -e '.[cuda]' brings it"
    span = f"sm_{min(archs)}..sm_{max(archs)}" if archs else "no archs"
    return f"usable, version {major}.{minor} (CUBIN for {span}; `python -m gg kernels` needs no GPU)"


def _info(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="python -m gg info", description=(
        "What this machine offers: backends, why CUDA is not usable, NVRTC.")).parse_args(argv)
    import platform

    import numpy as np

    from . import __version__
    from .backends import base
    print(f"gg {__version__} (python {platform.python_version()}, numpy {np.__version__})")
    for name in base.names():
        try:
            backend = base.get(name)
            ok, why = backend.available(), ""
            if not ok and name == "cuda":
                why = _cuda_why(backend, base.cuda_unavailable_reason())
            elif not ok:
                why = getattr(backend, "unavailable_reason", "") or ""
        except Exception as e:  # noqa: BLE001 - report, don't crash
            ok, why = False, (_cuda_why(None, str(e)) if name == "cuda" else str(e))
        print(f"  backend {name:5s} {'available' if ok else 'not available'}" + (f": {why}" if why else ""))
        if name == "cuda" and ok:
            try:
                from .backends.cuda import runtime
                rt = runtime.get()
                print(f"  GPU           {getattr(rt, 'name', '?')} ({rt.arch})")
            except Exception as e:  # noqa: BLE001
                print(f"  GPU           not usable ({e})")
    print(f"  NVRTC         {_nvrtc_line()}")
    print(f"  default priority: {base.default_priority()}")
    return 0


def _models(cmd: str, argv: list[str]) -> int:
    """`run` and `bench` live in gg.models.cli (imported only when asked for: it needs the
    `models` extra)."""
    try:
        cli = importlib.import_module("gg.models.cli")
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        if missing.split(".")[0] in _MODEL_PACKAGES:
            print(f"{cmd}: needs {missing}: pip install -e '.[models]'", file=sys.stderr)
        else:
            print(f"{cmd}: the model runner (gg.models.cli) is not available in this install ({e})",
                  file=sys.stderr)
        return 2
    entry = getattr(cli, f"{cmd}_main", None)
    if entry is None:
        print(f"{cmd}: gg.models.cli has no {cmd}_main", file=sys.stderr)
        return 2
    return int(entry(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as demo_main
        return demo_main(rest)
    if cmd in ("run", "bench"):
        return _models(cmd, rest)
    if cmd == "kernels":
        return _kernels(rest)
    if cmd == "info":
        return _info(rest)
    print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
