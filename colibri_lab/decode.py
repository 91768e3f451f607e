"""`Decoder`: one request's token bytes -> text, the one place it is done.

Streaming text must never split a UTF-8 character and never show bytes that
may still turn out to start a stop string; the final text ends where the
engine says the matched stop string starts (`stop_offset`, found in C on the
output bytes).  Engine.generate / stream, the server and the experiment
runner all decode through this class, so the three agree byte for byte,
including which tokens belong to the kept text (for logprobs).
"""
from __future__ import annotations

from typing import Callable, Sequence


class Decoder:
    def __init__(self, token_bytes: Callable[[int], bytes], stops: Sequence[bytes] = ()):
        self._token_bytes = token_bytes
        self.stops = [s for s in stops if s]
        self.buf = bytearray()     # every output byte so far (appended in place: O(1) a token)
        self.emitted = 0           # bytes already handed out as text
        self.tokens: list[int] = []
        self.offsets: list[int] = []   # byte offset where each token starts
        self.end: int | None = None    # final length of the output (after finish)

    def feed(self, token: int) -> str:
        """Add one generated token; returns the text that may be shown now."""
        self.tokens.append(token)
        self.offsets.append(len(self.buf))
        self.buf += self._token_bytes(token)
        if not self.stops:
            return self._take(len(self.buf))
        end = len(self.buf) - self._held_back()
        for s in self.stops:  # a stop string completed by this token: never show it
            i = self.buf.find(s, max(0, self.emitted - len(s) + 1))
            if i >= 0:
                end = min(end, i)
        return self._take(end)

    def finish(self, stop_offset: int = -1) -> str:
        """The request ended; stop_offset >= 0 cuts the output there.  Returns the rest of the text."""
        self.end = stop_offset if stop_offset >= 0 else len(self.buf)
        return self._take(self.end, final=True)

    # -- the final output (after finish)
    @property
    def text(self) -> str:
        return self.buf[:self.end].decode("utf-8", errors="replace")

    @property
    def n_kept(self) -> int:
        """Tokens whose bytes start before the cut (the rest only spelled the stop string)."""
        return sum(1 for o in self.offsets if o < self.end)

    @property
    def stop_sequence(self) -> bytes | None:
        """The stop string that ended the output, if one did."""
        if self.end is None or self.end >= len(self.buf):
            return None
        rest = self.buf[self.end:]
        return next((s for s in self.stops if rest.startswith(s)), None)

    @classmethod
    def decode(cls, token_bytes, tokens, stop_offset: int = -1, stops=()) -> "Decoder":
        """A finished decoder over a whole output."""
        d = cls(token_bytes, stops)
        for t in tokens:
            d.tokens.append(t)
            d.offsets.append(len(d.buf))
            d.buf += token_bytes(t)
        d.finish(stop_offset)
        return d

    # -- internals
    def _held_back(self) -> int:
        hold = 0
        for s in self.stops:
            for j in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:j]):
                    hold = max(hold, j)
                    break
        return hold

    def _take(self, end: int, final: bool = False) -> str:
        if end <= self.emitted:
            return ""
        chunk = bytes(self.buf[self.emitted:end])
        if not final and chunk[-1] >= 0x80:
            # do not cut inside a UTF-8 sequence: keep an incomplete tail for later
            cut = len(chunk)
            for back in range(1, min(4, len(chunk)) + 1):
                b = chunk[-back]
                if b & 0xC0 == 0x80:
                    continue  # continuation byte: look further back for the lead
                need = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 1
                if need > back:
                    cut = len(chunk) - back
                break
            chunk = chunk[:cut]
        self.emitted += len(chunk)
        return chunk.decode("utf-8", errors="replace")
