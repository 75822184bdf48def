"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, which coding agents and the
Anthropic SDKs speak.

A request (:mod:`~llamafleet.api.anthropic_requests`) becomes the same chat turns an OpenAI chat request does, so it
runs through the model's own chat template. Its answer is a text block, then a ``tool_use`` block per tool call
(parsed out by :mod:`~llamafleet.api.tool_calls`, whole or held back while streaming), with Anthropic's
``stop_reason``; a stream sends Anthropic's named events (``message_start`` ... ``message_stop``). Errors on these
routes use Anthropic's body (:mod:`llamafleet.api.errors` picks it by path). ``count_tokens`` asks a replica to
tokenize the conversation through the real template without generating anything, as ``/tokenize`` does
(:func:`~llamafleet.api.tokens.tokenized`).

Which stop sequence ended an answer is found from the tokens' bytes (the engine cuts the stop string from the text):
a request with ``stop_sequences`` therefore asks for its tokens' pieces, at the cost of a logprob per token.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from llamafleet.api.aggregate import Choice, respond
from llamafleet.api.anthropic_requests import CountTokensRequest, MessagesRequest
from llamafleet.api.errors import ApiError, refuse_unbuilt
from llamafleet.api.protocol import Event, NamedEvents, Usage, sse_event
from llamafleet.api.service import ServiceDep
from llamafleet.api.tokens import tokenized
from llamafleet.api.tool_calls import CallStreams, ParsedCall, parse
from llamafleet.engine.types import ContextOverflow, FinishReason
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


# -- responses -------------------------------------------------------------------------------------------------
class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]

    @classmethod
    def of(cls, call: ParsedCall, streamed: bool = False) -> ToolUseBlock:
        """A call's block; streamed, its input is ``{}`` (it follows as an ``input_json_delta``)."""
        return cls(id=f"toolu_{uuid.uuid4().hex[:24]}", name=call.name, input={} if streamed else
                   json.loads(call.arguments))


class MessageUsage(BaseModel):
    """Anthropic counts prompt tokens read from the cache apart from ``input_tokens`` (the rest); nothing here is
    written to a cache on request, so ``cache_creation_input_tokens`` stays 0."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> MessageUsage:
        return cls(input_tokens=prompt_tokens - cached_tokens, output_tokens=output_tokens,
                   cache_read_input_tokens=cached_tokens)


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int


def matched_stop(text: str, pieces: Sequence[bytes], stops: Sequence[str]) -> str | None:
    """The stop sequence that ended an answer whose text is ``text`` and whose tokens are ``pieces``: the engine cut
    it from the text, so it is where the tokens' text goes on past the answer (the shortest one there: it completed
    first)."""
    rest = b"".join(pieces).decode("utf-8", errors="replace")[len(text):]
    return min((s for s in stops if rest.startswith(s)), key=len, default=None)


def stop_reason(finish: FinishReason | None, stop: str | None, calls: list[ParsedCall]) -> StopReason | None:
    if finish is None:
        return None
    if finish == "length":
        return "max_tokens"
    return "tool_use" if calls else "stop_sequence" if stop is not None else "end_turn"


@dataclass
class MessageRenderer(NamedEvents):
    """One Anthropic message, whole or as its stream of events (``n`` is always 1). With tools, the text block is
    opened only once there is text to send (a call may come first), and each call follows as a ``tool_use`` block
    sent whole when the answer ends."""

    mid: str
    model: str
    stops: tuple[str, ...]
    calls: CallStreams | None = None  # the tools whose calls are parsed out of the answer (None: no tools)
    started: bool = False
    blocks: int = 0  # content blocks opened so far
    text: str = ""  # streamed so far (to find the stop sequence at the end)
    pieces: list[bytes] = field(default_factory=list)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        """Anthropic's wording of a prompt too long for the context (clients such as coding agents match it)."""
        n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
        if prompt >= n_ctx or limit is None:
            return ApiError(400, f"prompt is too long: {prompt} tokens > {n_ctx - 1} maximum", param="messages")
        return ApiError(400, f"input length and `max_tokens` exceed context limit: {prompt} + {limit} > {n_ctx}, "
                             "decrease input length or `max_tokens` and try again", param="max_tokens")

    def _message(self, blocks: list[TextBlock | ToolUseBlock], reason: StopReason | None, stop: str | None,
                 usage: MessageUsage) -> Message:
        return Message(id=self.mid, model=self.model, content=blocks, stop_reason=reason, stop_sequence=stop,
                       usage=usage)

    def _open(self, block: TextBlock | ToolUseBlock) -> list[Event]:
        """A block's ``content_block_start`` (the first one followed by a ``ping``, as Anthropic sends it)."""
        events = [Event.of("content_block_start", index=self.blocks, content_block=block)]
        self.blocks += 1
        return events + ([Event.of("ping")] if self.blocks == 1 else [])

    def opening(self, n_choices: int) -> list[Event]:
        return []

    def chunk(self, index: int, delta: Delta) -> list[Event]:
        out = delta.output
        events = []
        if not self.started:  # the first output: its prompt count opens the message
            self.started = True
            usage = MessageUsage.of(out.prompt_tokens, out.cached_tokens, 0)
            events.append(Event.of("message_start", message=self._message([], None, None, usage)))
        self.pieces += delta.pieces or []
        self.text += out.text
        text, calls = (out.text, []) if self.calls is None else self.calls.feed(0, out.text, out.finished)
        if not self.blocks and (text or self.calls is None or (out.finished and not calls)):
            events += self._open(TextBlock(text=""))  # the text block is always the first
        if text:
            events.append(Event.of("content_block_delta", index=0, delta={"type": "text_delta", "text": text}))
        if out.finished:
            events += [Event.of("content_block_stop", index=0)] if self.blocks else []
            for call in calls:
                at = self.blocks
                events += [*self._open(ToolUseBlock.of(call, streamed=True)),
                           Event.of("content_block_delta", index=at,
                                    delta={"type": "input_json_delta", "partial_json": call.arguments}),
                           Event.of("content_block_stop", index=at)]
            stop = matched_stop(self.text, self.pieces, self.stops) if out.finish_reason == "stop" else None
            events += [Event.of("message_delta",
                                delta={"stop_reason": stop_reason(out.finish_reason, stop, calls),
                                       "stop_sequence": stop},
                                usage={"output_tokens": out.completion_tokens}),
                       Event.of("message_stop")]
        return events

    def closing(self, usage: Usage) -> list[Event]:
        return []

    def whole(self, choices: list[Choice], usage: Usage) -> Message:
        (choice,) = choices
        gen = choice.generation
        content, calls = (gen.text, []) if self.calls is None else parse(gen.text, self.calls.names)
        stop = matched_stop(gen.text, choice.pieces, self.stops) if gen.finish_reason == "stop" else None
        texts: list[TextBlock | ToolUseBlock] = [TextBlock(text=content or "")] if content or not calls else []
        return self._message(texts + [ToolUseBlock.of(c) for c in calls], stop_reason(gen.finish_reason, stop, calls),
                             stop, MessageUsage.of(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                                                   usage.completion_tokens))

    def failed(self, error: ApiError) -> str:
        return sse_event(Event.model_validate(error.anthropic_body()))


@routes.post("/v1/messages", response_model=Message)
async def messages(body: MessagesRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    mid = f"msg_{uuid.uuid4().hex}"
    group = service.submit([Submit(mid, body.sampling(), chat=body.turns(), tools=body.tool_chat())])
    calls = CallStreams.over(body.callable, body.forced)
    render = MessageRenderer(mid, service.model_name, tuple(body.stop_sequences), calls)
    return await respond(group, render, request, body.stream, 1)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, service: ServiceDep) -> TokenCount:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    counted = await tokenized(service, request, chat=body.turns(), tools=body.tool_chat())
    return TokenCount(input_tokens=counted.prompt_tokens)
