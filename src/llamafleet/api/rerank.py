"""Reranking: ``POST /v1/rerank`` (and ``/rerank``, ``/v1/reranking``, ``/reranking``), as llama-server, Jina and
Cohere clients send it.

A query and its documents in; each document's relevance to the query out, most relevant first. A reranker GGUF (a
cross-encoder: its pooling type is ``rank``) scores each query-document pair; the pairs of one request travel
together in one :class:`~llamafleet.fleet.messages.Submit` and are packed into the passes that also carry
embedding inputs (:mod:`llamafleet.engine.embedding`). The scores are the model's raw outputs (as llama-server gives
them): higher is more relevant, not a probability.

The request: ``query``, ``documents`` (strings, or objects with a ``text``: Jina's and Cohere's shape), ``top_n``
(the most relevant few; all by default), ``return_documents`` (each result carries ``document: {"text": ...}``).
``texts`` instead of ``documents`` is Hugging Face TEI's shape, which llama-server also takes: the answer is then a
bare list of ``{index, score}`` (``text`` too with ``return_text``). ``model`` may be left out: the first model served
here that can rerank answers. A model that cannot rerank is a 400 that names those that can.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator, model_validator

from llamafleet.api.aggregate import collect
from llamafleet.api.embeddings import MAX_INPUTS
from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import Request as Body
from llamafleet.api.protocol import check_unicode
from llamafleet.api.service import Service, ServiceDep
from llamafleet.engine.types import ContextOverflow, SamplingParams
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.models import ManagedModel

routes = APIRouter()


class Document(Body):
    text: str


class RerankRequest(Body):
    model: str | None = None
    query: str
    documents: list[str | Document] | None = Field(None, min_length=1, max_length=MAX_INPUTS)
    texts: list[str] | None = Field(None, min_length=1, max_length=MAX_INPUTS)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False
    return_text: bool = False  # TEI's name for it (with texts)

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("send the documents to rank as 'documents' (or TEI's 'texts'), one of the two")
        return self

    @field_validator("query", "documents", "texts")
    @classmethod
    def _unicode(cls, v: str | list[str | Document] | None) -> str | list[str | Document] | None:
        check_unicode([d if isinstance(d, str) else d.text for d in ([v] if isinstance(v, str) else v or [])])
        return v

    @property
    def tei(self) -> bool:
        return self.texts is not None

    def document_texts(self) -> tuple[str, ...]:
        docs = self.texts if self.texts is not None else self.documents or []
        return tuple(d if isinstance(d, str) else d.text for d in docs)


def _overflow(overflow: ContextOverflow) -> ApiError:
    return ApiError(400, f"a query-document pair of {overflow.prompt_tokens} tokens is longer than this reranker reads "
                         f"({overflow.n_ctx} tokens per pair: its context per sequence, or the context it was trained "
                         "for); shorten the query or the longest documents", param="documents",
                    code="context_length_exceeded")


def _result(index: int, score: float, text: str, body: RerankRequest) -> dict[str, Any]:
    if body.tei:
        return {"index": index, "score": score, **({"text": text} if body.return_text else {})}
    return {"index": index, "relevance_score": score, **({"document": {"text": text}} if body.return_documents
                                                           else {})}


def _check(service: Service, model: ManagedModel) -> None:
    if not model.reranker:
        rerankers = [m.name for m in service.models.models if m.reranker]
        can = (f"the models served here that can: {', '.join(repr(n) for n in rerankers)}" if rerankers else
               "no model served here can; serve a reranker GGUF (pooling type 'rank', e.g. bge-reranker-v2-m3)")
        raise ApiError(400, f"model '{model.name}' cannot rerank: it is not a reranker (its pooling type is not "
                            f"'rank'); {can}", param="model", code="model_not_reranker")


async def _reranker(service: Service, name: str | None) -> Service:
    """``service`` bound to the model ``name`` (by default the first that can rerank), which must be a reranker:
    refused before it is loaded when its header says it is not one, else once its replicas said so."""
    if name is None:
        name = next((m.name for m in service.models.models if m.reranker), service.model_name)
    if (model := service.find_model(name)).demand is not None:
        _check(service, model)
    bound = await service.for_model(name)
    _check(service, bound.model)
    return bound


@routes.post("/v1/rerank")
@routes.post("/rerank")
@routes.post("/v1/reranking")
@routes.post("/reranking")
async def rerank(body: RerankRequest, request: Request, service: ServiceDep) -> JSONResponse:
    service = await _reranker(service, body.model)
    texts = body.document_texts()
    group = service.submit([Submit(f"rerank-{uuid.uuid4().hex}", SamplingParams(), rerank=(body.query, texts))])
    try:
        result = (await collect(group, request, _overflow))[0].generation
    finally:
        group.close()
    scores = [struct.unpack_from("<f", v)[0] for v in result.embeddings or []]  # the first of each pair's scores
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n]
    results = [_result(i, scores[i], texts[i], body) for i in order]
    if body.tei:
        return JSONResponse(results)
    return JSONResponse({
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "list",
        "model": service.model_name,
        "results": results,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    })
