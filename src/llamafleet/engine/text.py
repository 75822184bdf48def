"""Turning token bytes into text safely: incremental UTF-8 decoding and stop strings that never leak.

A token may end in the middle of a UTF-8 character (byte-fallback tokens, CJK text), so bytes are decoded
incrementally and an incomplete tail waits for the next token. Text that could still be the start of a stop string
is held back until it either completes the stop string (the stop is not emitted) or can no longer match.
"""

from __future__ import annotations

import codecs


class Detokenizer:
    """Feed token bytes, get the text that is complete so far."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """At the end of a sequence: whatever bytes are left (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Holds back text that may be the beginning of a stop string; reports when one is completed."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit). After a hit, discard the matcher."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hit = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if hit >= 0:
            self._held = ""
            return buf[:hit], True
        keep = 0
        for s in self.stops:
            # longest suffix of buf that is a proper prefix of s
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of a sequence without a stop hit: the held-back text is real output."""
        held, self._held = self._held, ""
        return held
