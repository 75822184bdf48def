"""The OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``.

Each request becomes one sequence per choice and prompt (``n`` x prompts, index ``prompt * n + choice`` as OpenAI
numbers them), fanned out over the replicas by the dispatcher and put back together by :mod:`llamafleet.api.aggregate`.
The renderers here only decide the JSON shapes.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamafleet.api.aggregate import Choice, respond
from llamafleet.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
    TokenLogprob,
    Usage,
)
from llamafleet.api.service import ServiceDep
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()


def _token_text(piece: bytes) -> str:
    """A token's text; a token holding only part of a UTF-8 character shows as U+FFFD (its ``bytes`` are exact)."""
    return piece.decode("utf-8", errors="replace")


def _chat_logprobs(pieces: list[bytes], logprobs: list[float] | None) -> ChoiceLogprobs | None:
    if logprobs is None:
        return None
    return ChoiceLogprobs(content=[TokenLogprob(token=_token_text(p), logprob=lp, bytes=list(p))
                                   for p, lp in zip(pieces, logprobs, strict=True)])


def _text_logprobs(pieces: list[bytes], logprobs: list[float] | None, start: int = 0) -> CompletionLogprobs | None:
    if logprobs is None:
        return None
    tokens = [_token_text(p) for p in pieces]
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return CompletionLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=None, text_offset=offsets)


@dataclass(frozen=True)
class _Renderer:
    cid: str
    created: int
    model: str
    logprobs: bool

    def visible(self, delta: Delta) -> bool:
        """Worth a chunk: new text, the end, or tokens whose logprobs were asked for."""
        out = delta.output
        return bool(out.text or out.finished or (self.logprobs and out.token_ids))


class ChatRenderer(_Renderer):

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.cid, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n_choices: int) -> list[ChatCompletionChunk]:
        return [self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
                for i in range(n_choices)]

    def chunk(self, index: int, delta: Delta) -> ChatCompletionChunk | None:
        if not self.visible(delta):
            return None
        out = delta.output
        lps = _chat_logprobs(delta.pieces or [], out.logprobs) if self.logprobs else None
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(content=out.text or None), logprobs=lps,
                                            finish_reason=out.finish_reason)])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)

    def whole(self, choices: list[Choice], usage: Usage) -> ChatCompletion:
        return ChatCompletion(
            id=self.cid, created=self.created, model=self.model, usage=usage,
            choices=[
                ChatChoice(index=i, message=AssistantMessage(content=c.generation.text),
                           finish_reason=c.generation.finish_reason,
                           logprobs=_chat_logprobs(c.pieces, c.generation.logprobs) if self.logprobs else None)
                for i, c in enumerate(choices)
            ],
        )


@dataclass(frozen=True)
class TextRenderer(_Renderer):
    # where each choice's next token starts in its text, so streamed text_offset continues across chunks
    offsets: dict[int, int] = field(default_factory=dict)

    def opening(self, n_choices: int) -> list[Completion]:
        return []

    def chunk(self, index: int, delta: Delta) -> Completion | None:
        if not self.visible(delta):
            return None
        out = delta.output
        lps = None
        if self.logprobs:
            lps = _text_logprobs(delta.pieces or [], out.logprobs, self.offsets.get(index, 0))
            if lps is not None and lps.tokens:
                self.offsets[index] = self.offsets.get(index, 0) + sum(len(t) for t in lps.tokens)
        choice = CompletionChoice(index=index, text=out.text, logprobs=lps, finish_reason=out.finish_reason)
        return Completion(id=self.cid, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage: Usage) -> Completion:
        return Completion(id=self.cid, created=self.created, model=self.model, choices=[], usage=usage)

    def whole(self, choices: list[Choice], usage: Usage) -> Completion:
        return Completion(
            id=self.cid, created=self.created, model=self.model, usage=usage,
            choices=[
                CompletionChoice(index=i, text=c.generation.text, finish_reason=c.generation.finish_reason,
                                 logprobs=_text_logprobs(c.pieces, c.generation.logprobs) if self.logprobs else None)
                for i, c in enumerate(choices)
            ],
        )


@routes.post("/v1/chat/completions", response_model=ChatCompletion)
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep) -> Response:
    service.check_model(body.model)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    turns = tuple(m.turn() for m in body.messages)
    group = service.submit([
        Submit(f"{cid}-{c}", body.sampling(body.token_limit(), c, body.logprobs), chat=turns)
        for c in range(body.n)
    ])
    render = ChatRenderer(cid, created, service.model_name, body.logprobs)
    return await respond(group, render, request, body.stream, body.n, body.include_usage)


@routes.post("/v1/completions", response_model=Completion)
async def completions(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    service.check_model(body.model)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    want_logprobs = body.logprobs is not None
    group = service.submit([
        Submit(f"{cid}-{p * body.n + c}", body.sampling(body.max_tokens, c, want_logprobs), prompt=prompt)
        for p, prompt in enumerate(body.prompts())
        for c in range(body.n)
    ])
    render = TextRenderer(cid, created, service.model_name, want_logprobs)
    return await respond(group, render, request, body.stream, body.n, body.include_usage)


@routes.get("/v1/models")
async def list_models(service: ServiceDep) -> ModelList:
    return ModelList(data=[ModelCard(id=service.model_name, created=service.created)])


@routes.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, service: ServiceDep) -> ModelCard:
    service.check_model(model_id)
    return ModelCard(id=service.model_name, created=service.created)
