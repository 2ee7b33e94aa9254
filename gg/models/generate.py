"""Text generation: the token loop (stop at EOS, stop strings or max tokens) and text streaming that
emits a piece only once its UTF-8 bytes are complete."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """Turns token ids into text pieces. A piece is held back while the decoded text ends in U+FFFD
    (a character whose bytes span tokens not seen yet). Decoding only re-reads a short window of
    recent ids (prefix .. end), so each token costs O(1), and the window keeps decoders that strip a
    leading space (SentencePiece) consistent."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (incomplete bytes come out as U+FFFD)."""
        before = self.decode(self.ids[self.prefix:self.read])
        after = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]


class StopFilter:
    """Holds back text that may be the start of a stop string; `done` once one appeared."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.done = False

    def feed(self, piece: str) -> str:
        if not self.stops:
            return piece
        text = self.pending + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.done, self.pending = True, ""
            return text[:min(hits)]
        hold = 0  # the longest tail of text that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def stream_text(tokens: Iterator[int], decode: Callable[[Sequence[int]], str], eos_ids,
                stop: Sequence[str] = ()) -> Iterator[str]:
    """Text pieces of the token stream, ending at an EOS id or a stop string."""
    ts, sf = TextStream(decode), StopFilter(stop)
    for t in tokens:
        if t in eos_ids:
            break
        piece = sf.feed(ts.push(t))
        if piece:
            yield piece
        if sf.done:
            return
    tail = sf.feed(ts.flush())
    if not sf.done:
        tail += sf.flush()
    if tail:
        yield tail
