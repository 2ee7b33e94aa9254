#!/usr/bin/env python3
"""A quantized random-weight twin without llama.cpp: every F16 matrix of a GGUF file (the anchors'
gen_gguf.py output) replaced by random blocks of one quantized type with small finite scales
(random nibbles / int8 under scale 2^-8, Q4_1 minimum -2^-5), norms and metadata copied. For A/B
timing of gg's quantized kernels in a whole model when llama-quantize is not built (its files
are what bench_models compares with llama.cpp).

    python3 scripts/quant_twin.py IN-F16.gguf OUT.gguf q4_0|q4_1|q8_0 [q6_k|q8_0]

A fourth argument gives the output head that type instead, as llama-quantize does: output.weight,
or token_embd.weight when the model ties its head to the embedding (SmolLM2: llama-quantize's
Q4_1 file keeps a Q8_0 embedding, its 576-wide rows being no multiple of Q6_K's 256). A Q6_K head:
random 6-bit values, int8 scales 1..8, d 2^-8.
"""
from __future__ import annotations

import sys

import numpy as np

import gguf

SCALES = {"q8_0": ((0, 2.0 ** -8),), "q4_0": ((0, 2.0 ** -8),), "q4_1": ((0, 2.0 ** -8), (2, -2.0 ** -5)),
          "q6_k": ((208, 2.0 ** -8),)}
INT8_SCALES = {"q6_k": (192, 16)}  # (offset, count) of int8 sub-block scales, drawn from 1..8


def main() -> int:
    src, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    head = sys.argv[4] if len(sys.argv) > 4 else kind

    r = gguf.GGUFReader(src)
    head_name = "output.weight" if any(t.name == "output.weight" for t in r.tensors) else "token_embd.weight"

    def kind_of(name: str) -> str:
        return head if name == head_name else kind
    w = gguf.GGUFWriter(out, "llama")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    w.add_file_type(gguf.LlamaFileType[f"MOSTLY_{kind.upper()}"])
    rng = np.random.default_rng(0)
    plan = []
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # numpy order: rows first
        if t.tensor_type == gguf.GGMLQuantizationType.F16 and len(shape) == 2:
            qt = gguf.GGMLQuantizationType[kind_of(t.name).upper()]
            bsize, tsize = gguf.GGML_QUANT_SIZES[qt]
            nbytes = shape[0] * shape[1] // bsize * tsize
            w.add_tensor_info(t.name, (shape[0], shape[1] // bsize * tsize), np.dtype(np.uint8), nbytes, raw_dtype=qt)
            plan.append((t, shape))
        else:
            w.add_tensor_info(t.name, shape, t.data.dtype, t.data.nbytes)
            plan.append((t, None))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t, shape in plan:
        if shape is None:
            w.write_tensor_data(np.asarray(t.data))
            continue
        k = kind_of(t.name)
        bsize, tsize = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[k.upper()]]
        n = shape[0] * shape[1] // bsize
        raw = rng.integers(0, 256, (n, tsize), dtype=np.uint8)
        for off, v in SCALES[k]:
            raw[:, off:off + 2] = np.full(n, v, np.float16).view(np.uint8).reshape(n, 2)
        if k in INT8_SCALES:
            off, count = INT8_SCALES[k]
            raw[:, off:off + count] = rng.integers(1, 9, (n, count), dtype=np.uint8)
        w.write_tensor_data(raw.reshape(shape[0], -1))
    w.close()
    print(f"wrote {out}: {len(plan)} tensors, matrices as {kind}, {head_name} as {head}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
