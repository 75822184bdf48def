"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, which coding agents and the
Anthropic SDKs speak.

A request (:mod:`~llamafleet.api.anthropic_requests`) becomes the same chat turns an OpenAI chat request does, so it
runs through the model's own chat template. Its answer is a ``thinking`` block when the model reasoned, a text block,
then a ``tool_use`` block per tool call (split out by :mod:`~llamafleet.api.answer`; streamed, each block opens once
the model names its function and its input follows as ``input_json_delta`` pieces as it is written), with Anthropic's
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
from llamafleet.api.answer import AnswerStreams, Split
from llamafleet.api.anthropic_requests import CountTokensRequest, MessagesRequest
from llamafleet.api.errors import ApiError, refuse_unbuilt
from llamafleet.api.protocol import Event, NamedEvents, Usage, sse_event
from llamafleet.api.service import ServiceDep
from llamafleet.api.tokens import tokenized
from llamafleet.api.tool_calls import ParsedCall
from llamafleet.engine.types import ContextOverflow, FinishReason
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


# -- responses -------------------------------------------------------------------------------------------------
class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    """The model's reasoning; its ``signature`` is empty (nothing here signs it, and nothing checks it back)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]

    @classmethod
    def of(cls, call: ParsedCall, streamed: bool = False) -> ToolUseBlock:
        """A call's block; streamed, its input is ``{}`` (it follows as an ``input_json_delta``)."""
        return cls(id=call.id or f"toolu_{uuid.uuid4().hex[:24]}", name=call.name, input={} if streamed else
                   json.loads(call.arguments))


ContentBlock = ThinkingBlock | TextBlock | ToolUseBlock


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
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int


def matched_stop(text: str, pieces: Sequence[bytes], stops: Sequence[str], opened: str = "") -> str | None:
    """The stop sequence that ended an answer whose text is ``text`` and whose tokens are ``pieces``: the engine cut
    it from the text, so it is where the tokens' text goes on past the answer (the shortest one there: it completed
    first). ``opened``: the think marker the prompt opened, which starts the text but is none of its tokens."""
    written = b"".join(pieces).decode("utf-8", errors="replace")
    if opened and text.startswith(opened) and not written.startswith(opened):
        text = text[len(opened):]
    rest = written[len(text):]
    return min((s for s in stops if rest.startswith(s)), key=len, default=None)


def stop_reason(finish: FinishReason | None, stop: str | None, calls: list[ParsedCall]) -> StopReason | None:
    if finish is None:
        return None
    if finish == "length":
        return "max_tokens"
    return "tool_use" if calls else "stop_sequence" if stop is not None else "end_turn"


@dataclass
class MessageRenderer(NamedEvents):
    """One Anthropic message, whole or as its stream of events (``n`` is always 1). The reasoning, if any, is the
    first block; with tools or reasoning, the text block is opened only once there is text to send (a call may come
    first), and each call is a ``tool_use`` block, opened when the model names its function, its input streamed."""

    mid: str
    model: str
    stops: tuple[str, ...]
    answers: AnswerStreams | None = None  # splits reasoning and calls out of the answer (None: all is text)
    started: bool = False
    blocks: int = 0  # content blocks opened so far
    open_block: str = ""  # the kind of the block open now ("thinking", "text"; "" none)
    kinds: set[str] = field(default_factory=set)  # the kinds of the blocks opened so far
    text: str = ""  # streamed so far (to find the stop sequence at the end)
    pieces: list[bytes] = field(default_factory=list)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        """Anthropic's wording of a prompt too long for the context (clients such as coding agents match it)."""
        n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
        if prompt >= n_ctx or limit is None:
            return ApiError(400, f"prompt is too long: {prompt} tokens > {n_ctx - 1} maximum", param="messages")
        return ApiError(400, f"input length and `max_tokens` exceed context limit: {prompt} + {limit} > {n_ctx}, "
                             "decrease input length or `max_tokens` and try again", param="max_tokens")

    def _message(self, blocks: list[ContentBlock], reason: StopReason | None, stop: str | None,
                 usage: MessageUsage) -> Message:
        return Message(id=self.mid, model=self.model, content=blocks, stop_reason=reason, stop_sequence=stop,
                       usage=usage)

    def _open(self, block: ThinkingBlock | TextBlock | ToolUseBlock) -> list[Event]:
        """A block's ``content_block_start`` (the first one followed by a ``ping``, as Anthropic sends it), after
        the end of the block open before it."""
        events = self._close()
        events.append(Event.of("content_block_start", index=self.blocks, content_block=block))
        self.blocks += 1
        self.open_block = block.type
        self.kinds.add(block.type)
        return events + ([Event.of("ping")] if self.blocks == 1 else [])

    def _close(self) -> list[Event]:
        if not self.open_block:
            return []
        self.open_block = ""
        return [Event.of("content_block_stop", index=self.blocks - 1)]

    def _delta(self, kind: str, text: str) -> list[Event]:
        """``text`` into the open block of ``kind`` (opened first if another is open)."""
        events = [] if self.open_block == kind else \
            self._open(ThinkingBlock(thinking="") if kind == "thinking" else TextBlock(text=""))
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        return events + [Event.of("content_block_delta", index=self.blocks - 1, delta=delta)]

    @property
    def _opened(self) -> str:
        """The think marker a prompt may open (it starts the answer's text; see :func:`matched_stop`)."""
        family = None if self.answers is None else self.answers.family
        return "" if family is None or family.think is None else family.think[0]

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
        part = Split(content=out.text) if self.answers is None else \
            self.answers.feed(0, out.text, out.finished, out.finish_reason == "length")
        if part.reasoning:
            events += self._delta("thinking", part.reasoning)
        if part.content or (self.answers is None and not self.blocks) or (
                out.finished and not part.calls and "text" not in self.kinds):
            events += self._delta("text", part.content) if part.content else self._open(TextBlock(text=""))
        for piece in part.pieces:
            if piece.name is not None:
                events += self._open(ToolUseBlock.of(ParsedCall(piece.name, "{}", piece.id), streamed=True))
            events.append(Event.of("content_block_delta", index=self.blocks - 1,
                                   delta={"type": "input_json_delta", "partial_json": piece.arguments}))
        calls = part.calls
        if out.finished:
            events += self._close()
            stop = matched_stop(self.text, self.pieces, self.stops, self._opened) \
                if out.finish_reason == "stop" else None
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
        part = Split(content=gen.text) if self.answers is None else \
            self.answers.whole(gen.text, gen.finish_reason == "length")
        calls = part.calls
        stop = matched_stop(gen.text, choice.pieces, self.stops, self._opened) if gen.finish_reason == "stop" else None
        blocks: list[ContentBlock] = \
            [ThinkingBlock(thinking=part.reasoning)] if part.reasoning else []
        blocks += [TextBlock(text=part.content)] if part.content or not calls else []
        return self._message(blocks + [ToolUseBlock.of(c) for c in calls], stop_reason(gen.finish_reason, stop, calls),
                             stop, MessageUsage.of(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                                                   usage.completion_tokens))

    def failed(self, error: ApiError) -> str:
        return sse_event(Event.model_validate(error.anthropic_body()))


@routes.post("/v1/messages", response_model=Message)
async def messages(body: MessagesRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    mid = f"msg_{uuid.uuid4().hex}"
    body.served_by(service.model_serving)
    group = service.submit([Submit(mid, body.sampling(), chat=body.turns(), tools=body.tool_chat())])
    answers = AnswerStreams.over(service.family, body.callable, body.forced)
    render = MessageRenderer(mid, service.model_name, tuple(body.stop_sequences), answers)
    return await respond(group, render, request, body.stream, 1)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, service: ServiceDep) -> TokenCount:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    body.served_by(service.model_serving)
    counted = await tokenized(service, request, chat=body.turns(), tools=body.tool_chat())
    return TokenCount(input_tokens=counted.prompt_tokens)
