"""`FAMILY.NAME=N` switches of the A/B scripts (scripts/model_steps.py --const, scripts/cubin_pack.sh
CONSTS=): any integer constant of a CUDA family module (gg/backends/cuda/families/FAMILY.py) or of
gg/backends/cuda/launch.py, set on the module and on the NVRTC define of the same name (or QUANT_
and the name: blocks.MVS_THREADS is QUANT_MVS_THREADS), so plan and kernels agree."""
from __future__ import annotations

import importlib


def apply(specs: list[str]) -> None:
    """Set each `FAMILY.NAME=N` of specs; SystemExit naming a constant the module lacks."""
    for c in specs:
        path, n = c.split("=")
        fam, name = path.rsplit(".", 1)
        mod = importlib.import_module("gg.backends.cuda." + ("launch" if fam == "launch" else "families." + fam))
        if not hasattr(mod, name):
            raise SystemExit(f"--const: {fam} has no {name}")
        setattr(mod, name, int(n))
        for defs in getattr(mod, "DEFINES", {}).values():
            for key in (name, "QUANT_" + name):
                if key in defs:
                    defs[key] = int(n)
