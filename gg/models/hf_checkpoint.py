"""A Hugging Face checkpoint directory: config.json, *.safetensors (read with `safetensors`),
tokenizer.json / tokenizer_config.json. Tensors are renamed to GGUF's names so one graph builder
serves both sources."""
from __future__ import annotations

import glob
import json
import os
import re
import struct
from typing import Iterator

import numpy as np

from ..errors import GGError
from .gguf_file import StoredTensor

_SAFETENSORS_TYPES = {"F32": (0, np.float32), "F16": (1, np.float16), "BF16": (30, np.uint16)}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def gguf_name(hf_name: str) -> str | None:
    """The GGUF name of an HF llama/qwen2 tensor (None for tensors gg does not use)."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    m = _LAYER_RE.match(hf_name)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}"
    return None


def _header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), 8 + n


class HFCheckpoint:
    """config (dict), tensors by GGUF name (memory-mapped), tokenizer files."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.isfile(cfg_path):
            raise GGError(f"model: {self.path} is not a Hugging Face checkpoint (no config.json)")
        with open(cfg_path) as fh:
            self.config = json.load(fh)
        files = sorted(glob.glob(os.path.join(self.path, "*.safetensors")))
        if not files:
            raise GGError(f"model: {self.path} has no *.safetensors files (gg reads safetensors only)")
        self._where: dict[str, tuple[str, str]] = {}
        for f in files:
            try:
                from safetensors import safe_open
                with safe_open(f, framework="numpy") as st:
                    keys = list(st.keys())
            except ImportError:
                raise GGError("model: reading safetensors needs the `safetensors` package") from None
            for k in keys:
                name = gguf_name(k)
                if name is not None:
                    self._where[name] = (f, k)

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def tensor(self, name: str) -> StoredTensor:
        if name not in self._where:
            raise GGError(f"model: checkpoint {self.path} has no tensor for '{name}'")
        f, key = self._where[name]
        header, start = _header(f)
        info = header[key]
        if info["dtype"] not in _SAFETENSORS_TYPES:
            raise GGError(f"model: tensor '{key}' has dtype {info['dtype']}; gg reads "
                          f"{', '.join(_SAFETENSORS_TYPES)} from safetensors")
        ggml_type, np_type = _SAFETENSORS_TYPES[info["dtype"]]
        lo, hi = info["data_offsets"]
        shape = tuple(info["shape"])
        # memory-mapped: the bytes are read while uploading, never held twice
        raw = np.memmap(f, dtype=np_type, mode="r", offset=start + lo, shape=shape) if hi > lo else \
            np.zeros(shape, np_type)
        return StoredTensor(name, raw, ggml_type, tuple(shape[::-1]) or (1,))

    def tensors(self) -> Iterator[StoredTensor]:
        for n in self._where:
            yield self.tensor(n)

    def file(self, name: str) -> str | None:
        p = os.path.join(self.path, name)
        return p if os.path.isfile(p) else None
