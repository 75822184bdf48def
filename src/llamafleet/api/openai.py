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
from pydantic import BaseModel

from llamafleet.api.aggregate import Choice, respond
from llamafleet.api.answer import AnswerStreams, Split
from llamafleet.api.call_stream import call_deltas
from llamafleet.api.errors import ApiError, refuse_unbuilt
from llamafleet.api.logprobs import chat_logprobs, prompt_text, text_logprobs
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.api.protocol import (
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    Usage,
    sse,
)
from llamafleet.api.service import ServiceDep
from llamafleet.api.tool_calls import calls_out, finish_reason
from llamafleet.engine.types import ContextOverflow, PromptLogprobs
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()


def context_error(overflow: ContextOverflow, param: str) -> ApiError:
    """OpenAI's words for a prompt too long for the context (client libraries match them, and the code, to trim their
    input), with this server's numbers: the context is the context per sequence."""
    n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
    start = f"This model's maximum context length is {n_ctx} tokens"
    if param in ("prompt", "input"):  # the wording of legacy completions, and of embeddings (0 for the completion)
        message = (f"{start}, however you requested {prompt + (limit or 0)} tokens ({prompt} in your prompt; "
                   f"{limit or 0} for the completion). Please reduce your prompt; or completion length.")
    elif limit is None:
        message = (f"{start}. However, your messages resulted in {prompt} tokens, which leaves no room for an "
                   "answer. Please reduce the length of the messages.")
    else:
        message = (f"{start}. However, you requested {prompt + limit} tokens ({prompt} in the messages, {limit} in "
                   "the completion). Please reduce the length of the messages or completion.")
    return ApiError(400, message, param=param, code="context_length_exceeded")


@dataclass(frozen=True)
class _Renderer:
    cid: str
    created: int
    model: str
    logprobs: bool
    include_usage: bool = False

    def visible(self, delta: Delta) -> bool:
        """Worth a chunk: new text, the end, or tokens whose logprobs were asked for."""
        out = delta.output
        return bool(out.text or out.finished or (self.logprobs and out.token_ids))

    def event(self, chunk: BaseModel) -> str:
        return sse(chunk)

    def failed(self, error: ApiError) -> str:
        return sse(error.body()) + SSE_DONE

    def end(self) -> str:
        return SSE_DONE


@dataclass(frozen=True)
class ChatRenderer(_Renderer):
    answers: AnswerStreams | None = None  # splits reasoning and calls out of the answers (None: all is content)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        return context_error(overflow, "messages")

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.cid, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n_choices: int) -> list[ChatCompletionChunk]:
        return [self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
                for i in range(n_choices)]

    def chunk(self, index: int, delta: Delta) -> list[ChatCompletionChunk]:
        if not self.visible(delta):
            return []
        out = delta.output
        lps = chat_logprobs(delta.pieces or [], out) if self.logprobs else None
        part = Split(content=out.text) if self.answers is None else \
            self.answers.feed(index, out.text, out.finished, out.finish_reason == "length")
        if not (part.content or part.reasoning or part.pieces or out.finished or lps):
            return []  # held back: it may be the start of a tool call or a marker
        thought = part.reasoning or None
        said = ChatDelta(content=part.content or None, reasoning_content=thought, reasoning=thought,
                         tool_calls=call_deltas(part.pieces))
        return [self._chunk([ChatChunkChoice(index=index, delta=said, logprobs=lps,
                                             finish_reason=finish_reason(part.calls, out.finish_reason))])]

    def closing(self, usage: Usage) -> list[ChatCompletionChunk]:
        return [self._chunk([], usage)] if self.include_usage else []

    def whole(self, choices: list[Choice], usage: Usage) -> ChatCompletion:
        return ChatCompletion(
            id=self.cid, created=self.created, model=self.model, usage=usage,
            choices=[self._choice(i, c) for i, c in enumerate(choices)],
        )

    def _choice(self, index: int, choice: Choice) -> ChatChoice:
        gen = choice.generation
        part = Split(content=gen.text) if self.answers is None else \
            self.answers.whole(gen.text, gen.finish_reason == "length")
        thought = part.reasoning or None
        message = AssistantMessage(content=part.content or None if part.calls else part.content,
                                   tool_calls=calls_out(part.calls), reasoning_content=thought, reasoning=thought)
        return ChatChoice(index=index, message=message, finish_reason=finish_reason(part.calls, gen.finish_reason),
                          logprobs=chat_logprobs(choice.pieces, gen) if self.logprobs else None)


@dataclass(frozen=True)
class TextRenderer(_Renderer):
    # where each choice's next token starts in its text, so streamed text_offset continues across chunks
    offsets: dict[int, int] = field(default_factory=dict)
    # with echo: each sequence's prompt text (None: token ids, echoed from their scores); which have been echoed
    echo: tuple[str | None, ...] | None = None
    echoed: set[int] = field(default_factory=set)

    def _echo(self, index: int, scores: PromptLogprobs | None, words: dict[int, bytes] | None) -> str:
        assert self.echo is not None
        text = self.echo[index]
        if text is None:
            assert scores is not None  # a token-id prompt that is echoed is always scored
            return prompt_text(scores, words or {})
        return text

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        return context_error(overflow, "prompt")

    def opening(self, n_choices: int) -> list[Completion]:
        return []

    def chunk(self, index: int, delta: Delta) -> list[Completion]:
        if not self.visible(delta):
            return []
        out = delta.output
        lps, echoed = None, ""
        if self.echo is not None and index not in self.echoed:  # the first output of this sequence
            self.echoed.add(index)
            echoed = self._echo(index, out.prompt_logprobs, out.token_bytes)
        if self.logprobs:
            lps = text_logprobs(delta.pieces or [], out, self.offsets.get(index, 0), out.prompt_logprobs)
            if lps is not None and lps.tokens:
                self.offsets[index] = self.offsets.get(index, 0) + sum(len(t) for t in lps.tokens)
        choice = CompletionChoice(index=index, text=echoed + out.text, logprobs=lps, finish_reason=out.finish_reason)
        return [Completion(id=self.cid, created=self.created, model=self.model, choices=[choice])]

    def closing(self, usage: Usage) -> list[Completion]:
        if not self.include_usage:
            return []
        return [Completion(id=self.cid, created=self.created, model=self.model, choices=[], usage=usage)]

    def whole(self, choices: list[Choice], usage: Usage) -> Completion:
        return Completion(
            id=self.cid, created=self.created, model=self.model, usage=usage,
            choices=[self._whole(i, c) for i, c in enumerate(choices)],
        )

    def _whole(self, index: int, choice: Choice) -> CompletionChoice:
        gen = choice.generation
        scores = gen.prompt_logprobs if self.echo is not None else None
        echoed = "" if self.echo is None else self._echo(index, scores, gen.token_bytes)
        lps = text_logprobs(choice.pieces, gen, 0, scores) if self.logprobs else None
        return CompletionChoice(index=index, text=echoed + gen.text, finish_reason=gen.finish_reason, logprobs=lps)


@routes.post("/v1/chat/completions", response_model=ChatCompletion)
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model, body.lora)
    refuse_unbuilt(body.not_yet())
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    body.served_by(service.model_serving)
    turns, tools = body.turns(), body.tool_chat()
    group = service.submit([
        Submit(f"{cid}-{c}", body.sampling(body.token_limit(), c, body.logprobs), chat=turns, tools=tools)
        for c in range(body.n)
    ], body.priority)
    answers = AnswerStreams.over(service.family, body.callable, body.forced)
    render = ChatRenderer(cid, created, service.model_name, body.logprobs, body.include_usage, answers)
    return await respond(group, render, request, body.stream, body.n)


@routes.post("/v1/completions", response_model=Completion)
async def completions(body: CompletionRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model, body.lora)
    refuse_unbuilt(body.not_yet())
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    want_logprobs = body.logprobs is not None
    prompts = body.prompts()
    group = service.submit([
        Submit(f"{cid}-{p * body.n + c}", body.sampling(body.max_tokens, c, want_logprobs, body.scores_prompt(prompt)),
               **({"prompt": prompt} if isinstance(prompt, str) else {"prompt_ids": prompt}))
        for p, prompt in enumerate(prompts)
        for c in range(body.n)
    ], body.priority)
    echo = tuple(p if isinstance(p, str) else None for p in prompts for _ in range(body.n)) if body.echo else None
    render = TextRenderer(cid, created, service.model_name, want_logprobs, body.include_usage, echo=echo)
    return await respond(group, render, request, body.stream, body.n)


