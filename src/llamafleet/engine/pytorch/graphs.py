"""Decode steps in fixed shapes, replayed as CUDA graphs: what a step of the torch engine costs the host.

Eager PyTorch launches each layer's kernels one by one from Python: a 7B model's decode step is of the order of a
thousand launches, about 20 ms of host time whatever the batch, which the GPU waits on (docs/BENCHMARKS.md, run
14). Here a
decode step's shapes are fixed: its rows are padded to a batch bucket (1, 2, 4, ... and the slot count) and the keys
each row attends to are cut at a key bucket (256, 512, ... and the context), the positions and tokens are an input
tensor and the mask is computed from them. On a CUDA device each (batch, keys) shape is captured as a CUDA graph
(at load every batch bucket at the key buckets up to :data:`WARM_KEYS`, a longer one on its first use), and a step
copies its tokens, slots and positions into that graph's input and replays it: one copy and one launch instead of a
launch per kernel.

Padding rows write their key and value at a slot's spare position (one past its context, never attended to:
:mod:`.forward`) and their logits are dropped. With every slot in the batch (the last bucket), row ``i`` is slot
``i`` and attention reads the KV buffers in place, without gathering the rows' slots.

Off a CUDA device the same shapes run eagerly (``capture=False``: how the tests hold them to the eager pass's
tokens). A capture or a replay that fails turns the graphs off for the engine's life with one warning; its decode
steps then run eagerly (:meth:`SlotModel.decode_eager`), as without this module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from llamafleet.engine.pytorch.forward import SlotModel

log = logging.getLogger(__name__)
MIN_KEYS = 256  # the smallest key bucket (the planner sizes contexts in steps of 256)
WARM_KEYS = 1024  # key buckets captured at load, for every batch bucket (longer ones on first use)


def buckets(top: int, first: int) -> list[int]:
    """``first``, twice that, ... below ``top``, then ``top``."""
    out = []
    n = first
    while n < top:
        out.append(n)
        n *= 2
    return [*out, top]


def bucket_of(n: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= n)


@dataclass
class _Shape:
    """One (batch, keys) shape: its input tensor ``[3, batch]`` (tokens, slots, positions) and, once captured, its
    graph and output."""

    ids: torch.Tensor
    graph: Any = None  # torch.cuda.CUDAGraph
    out: torch.Tensor | None = None


class StaticDecode:
    """``decode(tokens, slots, positions)`` for ``net`` in fixed shapes, captured as CUDA graphs when ``capture``."""

    def __init__(self, net: SlotModel, capture: bool) -> None:
        self.net = net
        self.capture = capture
        self.batches = buckets(net.n_slots, 1)
        self.keys = buckets(net.n_ctx, min(MIN_KEYS, net.n_ctx))
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._pool: Any = None
        self._stream: Any = None
        self.replays = 0  # decode steps replayed from a graph
        self.broken: str | None = None  # why capturing or replaying failed (then every step is eager)

    def close(self) -> None:
        self._shapes.clear()

    @torch.inference_mode()
    def warm(self, most_keys: int = WARM_KEYS) -> None:
        """Capture every batch bucket at the key buckets up to ``most_keys`` now (at load: the first requests should
        not wait for captures); longer ones are captured on first use."""
        t0 = time.perf_counter()
        for n_keys in [k for k in self.keys if k <= max(most_keys, self.keys[0])]:
            for b in self.batches:
                if self._shape(b, n_keys) is None:
                    return
        log.info("%d decode shapes %s in %.2f s", len(self._shapes),
                 "captured as CUDA graphs" if self.capture else "made", time.perf_counter() - t0)

    @torch.inference_mode()
    def __call__(self, tokens: list[int], slots: list[int], pos: list[int]) -> torch.Tensor:
        """The logits ``[n, vocab]`` of the ``n`` rows, in their order."""
        n, spare = len(tokens), self.net.n_ctx
        b, n_keys = bucket_of(n, self.batches), bucket_of(max(pos) + 1, self.keys)
        shape = None if self.broken is not None else self._shape(b, n_keys)
        if shape is None:  # capturing failed: eager from now on
            return self.net.decode_eager(tokens, slots, pos)
        every = b == self.net.n_slots
        if every:  # row i is slot i; idle slots write at their own spare position
            tok, at = [0] * b, [spare] * b
            for t, s, p in zip(tokens, slots, pos, strict=True):
                tok[s], at[s] = t, p
            rows = torch.tensor(slots, device=self.net.device)
            data = [tok, list(range(b)), at]
        else:
            pad = b - n
            data = [tokens + [0] * pad, slots + [0] * pad, pos + [spare] * pad]
        shape.ids.copy_(torch.tensor(data), non_blocking=True)
        if shape.graph is not None and shape.out is not None:
            try:
                shape.graph.replay()
            except RuntimeError as e:
                self._give_up("replaying", e)
                return self.net.decode_eager(tokens, slots, pos)
            self.replays += 1
            out = shape.out
        else:
            out = self.net.decode(shape.ids[0], shape.ids[1], shape.ids[2], n_keys, every)
        return out[rows] if every else out[:n]

    def _shape(self, b: int, n_keys: int) -> _Shape | None:
        """The shape of ``b`` rows and ``n_keys`` keys, captured the first time if ``capture`` (None: that failed)."""
        if (shape := self._shapes.get((b, n_keys))) is not None:
            return shape
        shape = _Shape(torch.empty((3, b), dtype=torch.long, device=self.net.device))
        if self.capture and not self._capture(shape, n_keys, b == self.net.n_slots):
            return None
        self._shapes[(b, n_keys)] = shape
        return shape

    def _capture(self, shape: _Shape, n_keys: int, every: bool) -> bool:
        """Capture ``shape``'s pass as a graph, after one eager run on the capture stream; its input holds padding
        meanwhile, so both write only at spare positions. False, with one warning, if it fails."""
        b = shape.ids.shape[1]
        slots = torch.arange(b) if every else torch.zeros(b, dtype=torch.long)
        shape.ids.copy_(torch.stack([torch.zeros(b, dtype=torch.long), slots,
                                     torch.full((b,), self.net.n_ctx, dtype=torch.long)]))

        def run() -> torch.Tensor:
            return self.net.decode(shape.ids[0], shape.ids[1], shape.ids[2], n_keys, every)

        try:
            if self._stream is None:
                self._stream, self._pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()  # type: ignore[no-untyped-call]
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                run()
            torch.cuda.current_stream().wait_stream(self._stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                out = run()
        except Exception as e:  # an operation that cannot be captured, memory, a build without CUDA graphs ...
            self._give_up("capturing", e)
            return False
        shape.graph, shape.out = graph, out
        log.debug("decode step of %d rows x %d keys captured as a CUDA graph", b, n_keys)
        return True

    def _give_up(self, doing: str, e: Exception) -> None:
        """Graphs off for good, said once: every later step runs eagerly."""
        self.broken = f"{type(e).__name__}: {e}"
        self._shapes.clear()
        log.warning("%s the decode step as a CUDA graph failed (%s); decode steps run eagerly", doing, self.broken)


def for_model(net: SlotModel, wanted: bool) -> StaticDecode | None:
    """``net``'s decode steps as CUDA graphs where they apply (``wanted``, the whole model on one CUDA device), else
    None: eager steps. The log says which, and why."""
    why = ("cuda_graphs: off" if not wanted else "not on a CUDA device" if net.device.type != "cuda" else
           "a layer split over several GPUs" if len(set(net.devices)) > 1 else None)
    if why is not None:
        log.info("decode steps run eagerly (%s)", why)
        return None
    graphs = StaticDecode(net, capture=True)
    log.info("decode steps replay CUDA graphs: batch buckets %s x key buckets %s (up to %d keys captured now)",
             graphs.batches, graphs.keys, WARM_KEYS)
    graphs.warm()
    return graphs
