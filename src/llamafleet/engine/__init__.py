"""The engine: continuous batching over llama.cpp, with no asyncio, sockets or HTTP (usable in-process)."""

from llamafleet.engine.types import (
    EngineConfig,
    EngineStats,
    FinishReason,
    Request,
    RequestOutput,
    SamplingParams,
)

__all__ = ["EngineConfig", "EngineStats", "FinishReason", "Request", "RequestOutput", "SamplingParams"]
