"""OpenAI's embeddings API: ``POST /v1/embeddings``.

One request is one unit of work on one replica: its inputs (up to :data:`MAX_INPUTS`, as OpenAI allows) travel
together in one :class:`~llamafleet.fleet.messages.Submit` and are packed into the same passes there (see
:mod:`llamafleet.engine.embedding` for how they run beside generations, and which pooling). Every served model has
embeddings: an embedding model's own, a generative model's mean-pooled hidden states; all are L2-normalised.

``encoding_format``: ``float`` (the default) gives lists of numbers; ``base64`` gives each vector's little-endian
float32 bytes in base64, which is what the OpenAI SDK asks for when the caller does not choose (it decodes them
itself). ``dimensions`` cannot shorten a vector here: it is accepted when it equals the model's size (known once
the vectors are back, so a different value is a 400 after they were computed). ``user`` is ignored.
"""

from __future__ import annotations

import base64
import struct
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator

from llamafleet.api.aggregate import collect
from llamafleet.api.errors import ApiError
from llamafleet.api.openai import context_error
from llamafleet.api.openai_requests import split_prompts
from llamafleet.api.protocol import Request as Body
from llamafleet.api.protocol import check_unicode
from llamafleet.api.service import ServiceDep
from llamafleet.engine.types import SamplingParams
from llamafleet.fleet.messages import Submit

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request

routes = APIRouter()


class EmbeddingRequest(Body):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v: str | list[str] | list[int] | list[list[int]]) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(v, list) and not 1 <= len(v) <= MAX_INPUTS:
            raise ValueError(f"a list of inputs needs 1 to {MAX_INPUTS} entries, got {len(v)}")
        parts = split_prompts(v)
        if any(len(p) == 0 for p in parts):
            raise ValueError("every input must be a non-empty string or a non-empty list of token ids")
        check_unicode([p for p in parts if isinstance(p, str)])
        return v


def encode(vector: bytes, encoding_format: str) -> list[float] | str:
    """One vector (little-endian float32 bytes) as the client asked for it: numbers, or those bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(vector).decode("ascii")
    return list(struct.unpack(f"<{len(vector) // 4}f", vector))


@routes.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, service: ServiceDep) -> JSONResponse:
    service = await service.for_model(body.model)
    inputs = tuple(split_prompts(body.input))
    group = service.submit([Submit(f"embd-{uuid.uuid4().hex}", SamplingParams(), embed=inputs)])
    try:
        result = (await collect(group, request, lambda overflow: context_error(overflow, "input")))[0].generation
    finally:
        group.close()
    vectors = result.embeddings or []
    size = len(vectors[0]) // 4 if vectors else 0
    if body.dimensions is not None and body.dimensions != size:
        raise ApiError(400, f"invalid 'dimensions': this model's embeddings have {size} dimensions and this server "
                            f"does not shorten them; send {size} or leave dimensions out", param="dimensions")
    return JSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": service.model_name,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    })
