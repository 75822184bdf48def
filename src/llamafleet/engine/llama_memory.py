"""A llama.cpp context's KV cache, edited sequence by sequence: a prefix kept, a sequence copied into another, its
state saved to host memory and restored (the prefix cache and the KV tiers are built on these).

One of the bindings modules (see :mod:`llamafleet.engine.llama`): :class:`KvMemory` is the part of
:class:`~llamafleet.engine.llama.Context` that edits its memory.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as lc  # isort: skip  (before numpy, see engine/llama.py)


class KvMemory:
    """The KV cache edits of a context: ``ptr`` (the context), ``memory`` (its ``llama_memory_t``),
    ``copy_sources`` and ``copy_targets`` (sequences copied from and into since the last decode) are the context's."""

    ptr: Any
    memory: Any
    copy_sources: set[int]
    copy_targets: set[int]

    def keep_prefix(self, seq: int, n: int) -> bool:
        """Drop sequence ``seq``'s cached tokens from position ``n`` on, keeping ``[0, n)``; False if this memory
        cannot cut a sequence part-way (recurrent models), and then nothing was removed."""
        return bool(lc.llama_memory_seq_rm(self.memory, seq, n, -1))

    def copy_sequence(self, src: int, dst: int) -> None:
        """Make ``dst`` hold what ``src`` holds, all of it (then :meth:`keep_prefix` cuts it).

        With one KV stream per sequence llama.cpp copies the *whole* stream, every cell of every layer whether used
        or not (a position range asserts: "seq_cp() is only supported for full KV buffers"). The cells' positions
        are copied now, the data at the start of the next ``llama_decode`` (its memory update, after a synchronize),
        before that decode writes anything. With a unified cache the cells are shared and nothing is copied.
        """
        lc.llama_memory_seq_rm(self.memory, dst, -1, -1)  # a unified cache adds to dst's cells; start it empty
        lc.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
        self.copy_sources.add(src)  # its data must not change before that decode: see restore_sequence
        self.copy_targets.add(dst)  # nor be read before it: see save_sequence

    def sequence_state_size(self, seq: int) -> int:
        """Bytes of :meth:`save_sequence`'s copy of sequence ``seq``'s state."""
        return int(lc.llama_state_seq_get_size_ext(self.ptr, seq, lc.LLAMA_STATE_SEQ_FLAGS_NONE))

    def save_sequence(self, seq: int, into: memoryview | None = None) -> memoryview | None:
        """Sequence ``seq``'s state (its KV cells, in llama.cpp's per-sequence state format), copied to host memory:
        into ``into`` (writable, exactly :meth:`sequence_state_size` bytes; engine/kv_buffers.py) or a new buffer;
        None if llama.cpp wrote less than it announced, or if a queued copy into ``seq`` has not landed yet."""
        if seq in self.copy_targets:
            return None
        n = self.sequence_state_size(seq)
        view = into if into is not None and len(into) == n else memoryview(bytearray(n))
        arr = (ctypes.c_uint8 * n).from_buffer(view)
        got = int(lc.llama_state_seq_get_data_ext(self.ptr, arr, n, seq, lc.LLAMA_STATE_SEQ_FLAGS_NONE))
        del arr  # the buffer may not be resized while a ctypes view exports it
        return view if got == n else None

    def restore_sequence(self, seq: int, state: bytearray | memoryview) -> bool:
        """Replace what sequence ``seq`` holds with ``state`` (from :meth:`save_sequence` of a context of the same
        model and shape); False if llama.cpp refused it, and then ``seq`` is left empty. ``seq`` must not be in
        :attr:`copy_sources` or :attr:`copy_targets`: the state is written at once, before a queued copy out of
        ``seq`` has read it (or one into it overwrites it)."""
        assert seq not in self.copy_sources and seq not in self.copy_targets
        arr = (ctypes.c_uint8 * len(state)).from_buffer(state)
        got = int(lc.llama_state_seq_set_data_ext(self.ptr, arr, len(state), seq, lc.LLAMA_STATE_SEQ_FLAGS_NONE))
        del arr
        if got != len(state):
            lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
            return False
        return True

    def kv_length(self, seq: int) -> int:
        """How many positions sequence ``seq`` has in the KV cache (``llama_memory_seq_pos_max`` + 1)."""
        return int(lc.llama_memory_seq_pos_max(self.memory, seq)) + 1

    def clear_all(self) -> None:
        if self.memory:  # encoder-only models (BERT) keep no KV cache at all
            lc.llama_memory_clear(self.memory, True)
