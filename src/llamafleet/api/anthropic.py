"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, which coding agents and the
Anthropic SDKs speak.

A request becomes the same chat turns an OpenAI chat request does (the system prompt first, then the messages; text
blocks joined), so it runs through the model's own chat template. Its answer is one text block with Anthropic's
``stop_reason``; a stream sends Anthropic's named events (``message_start`` ... ``message_stop``). Errors on these
routes use Anthropic's body (:mod:`llamafleet.api.errors` picks it by path). ``count_tokens`` asks a replica to
tokenize the conversation through the real template without generating anything.

Which stop sequence ended an answer is found from the tokens' bytes (the engine cuts the stop string from the text):
a request with ``stop_sequences`` therefore asks for its tokens' pieces, at the cost of a logprob per token.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, field_validator

from llamafleet.api.aggregate import Choice, collect, respond
from llamafleet.api.errors import ApiError, NotYet, refuse_unbuilt, unsupported
from llamafleet.api.protocol import Block, Event, NamedEvents, Usage, check_stops, check_unicode, sse_event
from llamafleet.api.protocol import Request as Body
from llamafleet.api.service import ServiceDep
from llamafleet.engine.types import ContextOverflow, FinishReason, SamplingParams
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import ChatTurn, Submit

routes = APIRouter()

TOOLS_LATER = "tool use is coming; remove it, or send null or []"
SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier turns' reasoning: not shown to the model again
TOOL_BLOCKS = ("tool_use", "tool_result", "server_tool_use", "web_search_tool_result")

StopReason = Literal["end_turn", "max_tokens", "stop_sequence"]


# -- requests --------------------------------------------------------------------------------------------------
class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[Block]) -> str | list[Block]:
        if isinstance(v, str):
            check_unicode([v])
        return v


def _text(content: str | list[Block], where: str) -> str:
    """The text of a message's (or the system prompt's) content; 400 naming the first block that is not text."""
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        param = f"{where}[{i}]"
        if block.type in TOOL_BLOCKS:
            raise unsupported(param, TOOLS_LATER)
        if block.type not in SKIPPED_BLOCKS:
            texts.append(block.text_of(param, ("text",)))
    return "".join(texts)


class CountTokensRequest(Body):
    """What ``count_tokens`` and ``messages`` share: the conversation, and the options about it."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] = ""
    tools: list[Any] = []
    tool_choice: dict[str, Any] = {"type": "auto"}
    output_config: dict[str, Any] = {}
    mcp_servers: list[Any] = []
    # accepted, ignored: no thinking blocks come back; no prompt cache to control (nothing is billed)
    thinking: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None

    def turns(self) -> tuple[ChatTurn, ...]:
        """The chat turns for the model's template (400 naming a block that is not text)."""
        system = _text(self.system, "system")
        turns = [(m.role, _text(m.content, f"messages[{i}].content")) for i, m in enumerate(self.messages)]
        return ((("system", system),) if system else ()) + tuple(turns)

    def not_yet(self) -> NotYet:
        """The parameters that need features not built yet (see :func:`~llamafleet.api.errors.refuse_unbuilt`)."""
        return [
            ("tools", bool(self.tools), TOOLS_LATER),
            ("tool_choice", self.tool_choice.get("type") not in ("auto", "none"),
             "no tools can be called yet; send {\"type\": \"auto\"}, {\"type\": \"none\"} or null"),
            ("output_config.format", "format" in self.output_config, "structured output is coming; send null"),
            ("mcp_servers", bool(self.mcp_servers), "this server connects to no MCP server"),
        ]


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] = []
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(40, ge=0, lt=2**31)  # llama.cpp's default, as on the OpenAI routes
    # accepted, ignored
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str]) -> list[str]:
        check_stops(v)
        return v

    def sampling(self) -> SamplingParams:
        """The engine's parameters; with stop sequences, the tokens' pieces too (to tell which one matched)."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, min_p=0.05, stop=tuple(self.stop_sequences),
                              logprobs=bool(self.stop_sequences))


# -- responses -------------------------------------------------------------------------------------------------
class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


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
    content: list[TextBlock]
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


def stop_reason(finish: FinishReason | None, stop: str | None) -> StopReason | None:
    if finish is None:
        return None
    return "max_tokens" if finish == "length" else "stop_sequence" if stop is not None else "end_turn"


@dataclass
class MessageRenderer(NamedEvents):
    """One Anthropic message, whole or as its stream of events (``n`` is always 1)."""

    mid: str
    model: str
    stops: tuple[str, ...]
    started: bool = False
    text: str = ""  # streamed so far (to find the stop sequence at the end)
    pieces: list[bytes] = field(default_factory=list)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        """Anthropic's wording of a prompt too long for the context (clients such as coding agents match it)."""
        n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
        if prompt >= n_ctx or limit is None:
            return ApiError(400, f"prompt is too long: {prompt} tokens > {n_ctx - 1} maximum", param="messages")
        return ApiError(400, f"input length and `max_tokens` exceed context limit: {prompt} + {limit} > {n_ctx}, "
                             "decrease input length or `max_tokens` and try again", param="max_tokens")

    def _message(self, text: str, finish: FinishReason | None, stop: str | None, usage: MessageUsage) -> Message:
        return Message(id=self.mid, model=self.model, content=[TextBlock(text=text)] if text or finish else [],
                       stop_reason=stop_reason(finish, stop), stop_sequence=stop, usage=usage)

    def opening(self, n_choices: int) -> list[Event]:
        return []

    def chunk(self, index: int, delta: Delta) -> list[Event]:
        out = delta.output
        events = []
        if not self.started:  # the first output: its prompt count opens the message
            self.started = True
            usage = MessageUsage.of(out.prompt_tokens, out.cached_tokens, 0)
            events += [Event.of("message_start", message=self._message("", None, None, usage)),
                       Event.of("content_block_start", index=0, content_block=TextBlock(text="")),
                       Event.of("ping")]
        self.pieces += delta.pieces or []
        if out.text:
            self.text += out.text
            events.append(Event.of("content_block_delta", index=0, delta={"type": "text_delta", "text": out.text}))
        if out.finished:
            stop = matched_stop(self.text, self.pieces, self.stops) if out.finish_reason == "stop" else None
            events += [Event.of("content_block_stop", index=0),
                       Event.of("message_delta",
                             delta={"stop_reason": stop_reason(out.finish_reason, stop), "stop_sequence": stop},
                             usage={"output_tokens": out.completion_tokens}),
                       Event.of("message_stop")]
        return events

    def closing(self, usage: Usage) -> list[Event]:
        return []

    def whole(self, choices: list[Choice], usage: Usage) -> Message:
        (choice,) = choices
        gen = choice.generation
        stop = matched_stop(gen.text, choice.pieces, self.stops) if gen.finish_reason == "stop" else None
        return self._message(gen.text, gen.finish_reason, stop,
                             MessageUsage.of(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                                             usage.completion_tokens))

    def failed(self, error: ApiError) -> str:
        return sse_event(Event.model_validate(error.anthropic_body()))


@routes.post("/v1/messages", response_model=Message)
async def messages(body: MessagesRequest, request: Request, service: ServiceDep) -> Response:
    service.check_model(body.model)
    refuse_unbuilt(body.not_yet())
    mid = f"msg_{uuid.uuid4().hex}"
    group = service.submit([Submit(mid, body.sampling(), chat=body.turns())])
    render = MessageRenderer(mid, service.model_name, tuple(body.stop_sequences))
    return await respond(group, render, request, body.stream, 1)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request, service: ServiceDep) -> TokenCount:
    service.check_model(body.model)
    refuse_unbuilt(body.not_yet())
    group = service.submit([Submit(f"count-{uuid.uuid4().hex}", SamplingParams(), chat=body.turns(),
                                   count_only=True)])
    try:
        (choice,) = await collect(group, request)
    finally:
        group.close()
    return TokenCount(input_tokens=choice.generation.prompt_tokens)
