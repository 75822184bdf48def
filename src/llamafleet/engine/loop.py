"""What every engine's loop shares, whatever runs the model (llama.cpp's :class:`~llamafleet.engine.engine.Engine`,
the torch engine): a request cancelled while it waits or runs, ``with`` to free the engine, and :meth:`generate` for
in-process use (tests, the consistency checker, benchmarks)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from types import TracebackType
from typing import Self

from llamafleet.engine.held_keys import HeldChange
from llamafleet.engine.scheduler import Waiting
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import FinishReason, Generation, Request, RequestOutput


class EngineLoop(ABC):
    """The engine's queues (``_waiting``: admitted by ``step``, ``_running``: in slots) and the calls built on them."""

    _waiting: Waiting
    _running: list[Sequence]
    reports_held = False  # whether :meth:`held_change` reports what its KV holds

    def held_change(self) -> HeldChange | None:
        """The router's prefix keys this engine's KV gained and lost since the last call (engine/held_keys.py);
        None: no change, or an engine that does not report them."""
        return None

    def disk_tier(self) -> str | None:
        """The folder of the disk tier its KV spills to, which other replicas of the model may share (None: none)."""
        return None

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def add_request(self, req: Request) -> None: ...

    @abstractmethod
    def has_work(self) -> bool: ...

    @abstractmethod
    def step(self) -> list[RequestOutput]: ...

    @abstractmethod
    def _finish(self, s: Sequence, reason: FinishReason) -> RequestOutput: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _cancel(self, rid: str, outs: list[RequestOutput]) -> None:
        """End request ``rid`` as cancelled, waiting or running (an unknown id: nothing)."""
        req = self._waiting.remove(rid)
        if req is not None:
            outs.append(RequestOutput(rid, finished=True, finish_reason="cancelled",
                                      prompt_tokens=len(req.prompt_tokens)))
        for s in self._running:
            if s.request_id == rid:
                outs.append(self._finish(s, "cancelled"))
                break

    def generate(self, requests: Iterable[Request]) -> dict[str, Generation]:
        """Run ``requests`` together (continuous batching) to completion; results keyed by request id."""
        results: dict[str, Generation] = {}
        for r in requests:
            self.add_request(r)
            results[r.request_id] = Generation(r.request_id)
        while self.has_work():
            for out in self.step():
                results[out.request_id].add(out)
        return results
