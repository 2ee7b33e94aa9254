"""Command line: `python -m gg demo | kernels | info`."""
from __future__ import annotations

import argparse
import sys

USAGE = """usage: python -m gg <command> [options]

commands:
  demo       run the llama attention/transformer block (prefill + decode) on the best backend,
             print the fused plan, check it against a float64 numpy model, print tokens/s
  kernels    compile every CUDA kernel variant with NVRTC (no GPU needed): --arch sm_80|sm_90|...
  info       what this machine offers (backends, GPU, NVRTC)

`python -m gg <command> --help` for a command's options."""


def _kernels(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gg kernels", description="Compile every CUDA kernel variant.")
    p.add_argument("--arch", default=None, help="target, e.g. sm_90 (default: this GPU's, else sm_90)")
    args = p.parse_args(argv)
    try:
        from .backends.cuda import catalog
    except ImportError as e:
        print(f"kernels: the CUDA backend cannot be loaded: {e}", file=sys.stderr)
        return 2
    results = catalog.compile_all(args.arch)
    bad = 0
    for r in results:
        name, arch, size, ok, err = r
        print(f"{name:48s} {arch:7s} {size:9d} B  {'ok' if ok else 'ERROR'}")
        if not ok:
            bad += 1
            print("    " + str(err).replace("\n", "\n    "), file=sys.stderr)
    print(f"{len(results) - bad}/{len(results)} kernels compiled for {results[0][1] if results else args.arch}")
    return 1 if bad or not results else 0


def _info(argv: list[str]) -> int:
    from . import __version__
    from .backends import base
    print(f"gg {__version__}")
    for name in base.names():
        try:
            ok = base.get(name).available()
            why = ""
        except Exception as e:  # noqa: BLE001 - report, don't crash
            ok, why = False, f" ({e})"
        print(f"  backend {name:5s} {'available' if ok else 'not available'}{why}")
    print(f"  default priority: {base.default_priority()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as demo_main
        return demo_main(rest)
    if cmd == "kernels":
        return _kernels(rest)
    if cmd == "info":
        return _info(rest)
    print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
