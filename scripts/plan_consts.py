"""`FAMILY.NAME=N` switches of the A/B scripts (scripts/model_steps.py --const, scripts/cubin_pack.sh
CONSTS=): any integer constant of a CUDA family module (gg/backends/cuda/families/FAMILY.py) or of
gg/backends/cuda/launch.py, set on the module and on the NVRTC define of the same name or of the
name after its kernel file's tag (blocks.MVS_THREADS is QUANT_MVS_THREADS, siblings.EPI_ROWS
SIB_EPI_ROWS, attention.THREADS FA_THREADS), so plan and kernels agree."""
from __future__ import annotations

import importlib

_TAGS = ("QUANT_", "SIB_", "FA_", "CPY_")  # a define's prefix naming its kernel file
# host constants whose tagged name is another constant's define: attention.CLUSTER_MAX (the host's
# cluster rule) is not FA_CLUSTER_MAX (attention.MAX_CLUSTER, the kernels' bound: 0 fails to compile)
_HOST_ONLY = {("attention", "CLUSTER_MAX")}


def apply(specs: list[str]) -> None:
    """Set each `FAMILY.NAME=N` of specs; SystemExit naming a constant the module lacks."""
    for c in specs:
        path, n = c.split("=")
        fam, name = path.rsplit(".", 1)
        mod = importlib.import_module("gg.backends.cuda." + ("launch" if fam == "launch" else "families." + fam))
        if not hasattr(mod, name):
            raise SystemExit(f"--const: {fam} has no {name}")
        setattr(mod, name, int(n))
        if (fam, name) in _HOST_ONLY:
            continue
        for defs in getattr(mod, "DEFINES", {}).values():
            for key in (name, *(t + name for t in _TAGS)):
                if key in defs:
                    defs[key] = int(n)


def types(names: str) -> tuple:
    """The block types of blocks.TYPES named in a comma list ("q8_0,q4_0"): the A/B scripts'
    --stream-types / --carry-types switches."""
    from gg.backends.cuda.families import blocks
    return tuple(t for t in blocks.TYPES if t.name in names.split(","))
