"""``POST /api/generate``, a simple route with timings: ``{"prompt", "max_tokens"}`` in, the text plus timings out.

The prompt is raw text (no chat template). Timings are measured in the API process, so they include routing and
queueing: time to first token, total time, and generated tokens per second after the first token.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request, Response

from llamafleet.api.aggregate import REPLICAS_HEADER, collect, usage
from llamafleet.api.protocol import GenerateRequest, GenerateResponse, Timings
from llamafleet.api.service import ServiceDep
from llamafleet.fleet.messages import Submit

routes = APIRouter()


@routes.post("/api/generate")
async def generate(body: GenerateRequest, request: Request, response: Response,
                   service: ServiceDep) -> GenerateResponse:
    t0 = time.perf_counter()
    service = await service.for_model(service.model_name)  # no 'model' field: the first configured model
    group = service.submit([Submit(f"gen-{uuid.uuid4().hex}", body.sampling(), prompt=body.prompt)])
    try:
        (choice,) = await collect(group, request)
    finally:
        group.close()
    response.headers[REPLICAS_HEADER] = str(group.replicas[0])  # where it ran (it may have moved, see Dispatcher)
    t_end = time.perf_counter()
    done = choice.generation
    first = choice.first_token_at or t_end
    decode_s = t_end - first
    rate = (done.completion_tokens - 1) / decode_s if done.completion_tokens > 1 and decode_s > 0 else 0.0
    return GenerateResponse(
        text=done.text,
        model=service.model_name,
        finish_reason=done.finish_reason,
        usage=usage([choice.generation], 1),
        timings=Timings(ttft_ms=1000 * (first - t0), total_ms=1000 * (t_end - t0), tokens_per_second=rate),
    )
