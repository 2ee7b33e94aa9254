"""A one-line progress bar on stderr (only when it is a terminal, or when asked)."""
from __future__ import annotations

import sys
import time


class Progress:
    """`update(done_bytes)` redraws `label [####....] 42% 12.3/98.0 MB`; `close()` ends the line."""

    def __init__(self, label: str, total: int, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.total, self.t0, self._last = label, max(int(total), 1), time.perf_counter(), -1.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < self.total and now - self._last < 0.1:  # redraw at most 10 times a second
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label} [{bar:<30s}] {frac:4.0%} {done / 1e6:.1f}/{self.total / 1e6:.1f} MB")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write(f"  ({time.perf_counter() - self.t0:.1f} s)\n")
            self.stream.flush()
