"""A GGUF file, read with the `gguf` package (memory-mapped): metadata and tensors in stored types."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import GGError


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as the file stores it: `raw` is a memory-mapped numpy view (no copy), `ggml_type`
    ggml's type number, `ne` ggml's element counts (innermost first)."""

    name: str
    raw: np.ndarray
    ggml_type: int
    ne: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


def _gguf():
    try:
        import gguf
    except ImportError:  # pragma: no cover - gguf is a dependency of the models room
        raise GGError("gguf: reading GGUF files needs the `gguf` package: pip install gguf") from None
    return gguf


class GGUFFile:
    """Metadata (`get(key)`, `arch`) and tensors (`tensors()`, `tensor(name)`) of a GGUF file."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGError(f"gguf: no such file: {self.path}")
        gguf = _gguf()
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises ValueError/struct.error on a bad file
            raise GGError(f"gguf: cannot read {self.path}: {e}") from e
        self._by_name = {t.name: t for t in self.reader.tensors}

    # ---- metadata -------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata `key` (str, number, bool or list), or `default`."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGError(f"gguf: {os.path.basename(self.path)} lacks metadata key '{key}'")
        return value

    @property
    def arch(self) -> str:
        return str(self.require("general.architecture"))

    def keys(self) -> list[str]:
        return list(self.reader.fields)

    # ---- tensors --------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._by_name)

    def has(self, name: str) -> bool:
        return name in self._by_name

    def tensor(self, name: str) -> StoredTensor:
        t = self._by_name.get(name)
        if t is None:
            raise GGError(f"gguf: {os.path.basename(self.path)} has no tensor '{name}'")
        return StoredTensor(t.name, t.data, int(t.tensor_type), tuple(int(n) for n in t.shape))

    def tensors(self) -> Iterator[StoredTensor]:
        for name in self._by_name:
            yield self.tensor(name)

    @property
    def nbytes(self) -> int:
        return int(sum(t.n_bytes for t in self.reader.tensors))
