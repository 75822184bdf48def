"""Host buffers for the RAM tier's KV states, recycled instead of allocated afresh for every save.

A sequence's state is tens of MB for a small model and GBs for a large one. Writing it into new memory makes the
kernel map and zero every page of it first: on the 2-core test machine a fresh 21 MB buffer cost 16-95 ms to fill
where one filled before took 1 ms, and the save sits on the path of the prompt that takes the slot. In a session
workload the buffers come free at the rate they are needed: a session's next state replaces its last one (the RAM
tier drops a state that a newer one extends, just before saving the newer one). So a buffer given back is kept and
lent to the next save that fits it, and a new buffer gets a quarter more room than its first state needs, so that
the same session's next, longer state fits it too.

Pure Python: the states are ``memoryview`` slices of ``bytearray`` buffers (llama.cpp writes into them through
:meth:`~llamafleet.engine.llama.Context.save_sequence`). The RAM tier counts a state by its buffer's size, and the
buffers kept here in :attr:`Buffers.bytes`, so its bound holds what the process really holds.
"""

from __future__ import annotations

HEADROOM = 4  # a new buffer holds its first state plus 1/HEADROOM of it
KEEP = 2  # buffers kept for the next saves (a session's old state is given back just before its new one is saved)


def buffer_size(n: int) -> int:
    """Bytes of a new buffer for a state of ``n`` bytes: room for the same session's next, longer one."""
    return n + n // HEADROOM


def _buffer(view: memoryview) -> bytearray:
    buf = view.obj
    assert isinstance(buf, bytearray)  # (Buffers.take and Context.save_sequence make them)
    return buf


def capacity(view: memoryview) -> int:
    """Bytes of the buffer under ``view``."""
    return len(_buffer(view))


class Buffers:
    """Buffers given back (:meth:`give`) and lent again (:meth:`take`); :attr:`bytes` is what they hold."""

    def __init__(self, keep: int = KEEP) -> None:
        self._free: list[bytearray] = []
        self._keep = keep
        self.bytes = 0
        self.reused = 0  # saves that got a buffer given back (no new memory)

    def _fitting(self, n: int) -> list[bytearray]:
        """The kept buffers that hold ``n`` bytes without wasting more than half of them."""
        return [b for b in self._free if n <= len(b) <= 2 * n]

    def new_bytes(self, n: int) -> int:
        """What :meth:`take` of ``n`` bytes adds to the memory held: 0 if a kept buffer fits."""
        return 0 if self._fitting(n) else buffer_size(n)

    def take(self, n: int) -> memoryview:
        """``n`` writable bytes: the smallest kept buffer that fits, else a new one with room to grow."""
        fitting = self._fitting(n)
        if fitting:
            buf = min(fitting, key=len)
            self._free.remove(buf)
            self.bytes -= len(buf)
            self.reused += 1
        else:
            buf = bytearray(buffer_size(n))
        return memoryview(buf)[:n]

    def give(self, view: memoryview) -> None:
        """``view``'s buffer is free (nothing may use ``view`` after this): kept for a later save, or freed."""
        buf = _buffer(view)
        view.release()
        if len(self._free) < self._keep:
            self._free.append(buf)
            self.bytes += len(buf)

    def clear(self) -> None:
        """Free every kept buffer."""
        self._free.clear()
        self.bytes = 0
