"""OpenAI's Responses API, text only: ``POST /v1/responses`` (the SDK's ``client.responses.create``).

``input`` (a string, or message items whose content is a string or text parts) and ``instructions`` become chat
turns for the model's own template, as a chat completion's messages do. The answer is a ``response`` object with one
assistant message; a stream sends the API's named events, each with its ``sequence_number``. The server is
stateless: nothing is stored, so ``previous_response_id`` (and ``conversation``) are refused with a 400 that says so,
and ``store`` is accepted and ignored. ``text.format`` takes chat's structured output formats (flat). Tools are
refused until tool calling exists.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from llamafleet.api.aggregate import Choice, respond
from llamafleet.api.errors import ApiError, NotYet, refuse_unbuilt, unsupported
from llamafleet.api.openai_requests import FormatType, format_grammar
from llamafleet.api.protocol import Block, Event, NamedEvents, Usage, check_unicode, sse_event
from llamafleet.api.protocol import Request as Body
from llamafleet.api.service import ServiceDep
from llamafleet.engine.types import ContextOverflow, FinishReason, SamplingParams
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import ChatTurn, Submit

routes = APIRouter()

TEXT_PARTS = ("input_text", "output_text", "text")
TOOLS_LATER = "tool calling is coming; remove it, or send null or []"
STATELESS = ("this server is stateless: it stores no responses or conversations, so send the whole conversation in "
             "'input' (and null here)")


# -- requests --------------------------------------------------------------------------------------------------
class Item(Body):
    """An input item: a message (other item kinds are accepted here so that the refusal can name them)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[Block] | None = None

    def turn(self, where: str) -> ChatTurn:
        if self.type.startswith(("function_call", "custom_tool_call")):
            raise unsupported(where, TOOLS_LATER)
        if self.type == "item_reference":
            raise unsupported(where, STATELESS)
        if self.type != "message":
            raise ApiError(400, f"'{where}': {self.type} items are not supported; send messages", param=where)
        if self.role is None or self.content is None:
            missing = f"{where}.{'role' if self.role is None else 'content'}"
            raise ApiError(400, f"missing required parameter '{missing}'", param=missing)
        role = "system" if self.role == "developer" else self.role
        if isinstance(self.content, str):
            check_unicode([self.content])
            return role, self.content
        return role, "".join(part.text_of(f"{where}.content[{i}]", TEXT_PARTS) for i, part in enumerate(self.content))


class TextFormat(Body):
    """``text.format``: Responses spells chat's ``response_format`` flat (``name``, ``schema`` beside ``type``)."""

    type: FormatType
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced
    description: str | None = None


class TextOptions(Body):
    format: TextFormat | None = None
    verbosity: str | None = None  # ignored


class ResponsesRequest(Body):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[Any] = []
    tool_choice: str | dict[str, Any] = "auto"
    text: TextOptions | None = None
    top_logprobs: int = Field(0, ge=0, le=20)
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool = False
    prompt: dict[str, Any] | None = None
    # accepted, ignored: nothing is stored or billed here, and the model does not reason apart from its answer
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] = []
    stream_options: dict[str, Any] | None = None

    @field_validator("input", "instructions")
    @classmethod
    def _unicode(cls, v: Any) -> Any:
        if isinstance(v, str):
            check_unicode([v])
        return v

    def not_yet(self) -> NotYet:
        """The parameters that need features not built yet (see :func:`~llamafleet.api.errors.refuse_unbuilt`)."""
        return [
            ("previous_response_id", self.previous_response_id is not None, STATELESS),
            ("conversation", self.conversation is not None, STATELESS),
            ("tools", bool(self.tools), TOOLS_LATER),
            ("tool_choice", self.tool_choice not in ("none", "auto"),
             "no tools can be called yet; send \"none\", \"auto\" or null"),
            ("top_logprobs", self.top_logprobs > 0, "top alternatives are not offered yet"),
            ("include", "message.output_text.logprobs" in self.include, "logprobs are not offered on this route"),
            ("background", self.background, "every response is answered while the request waits"),
            ("prompt", self.prompt is not None, "stored prompt templates are not kept here; send the text"),
        ]

    def turns(self) -> tuple[ChatTurn, ...]:
        system: tuple[ChatTurn, ...] = (("system", self.instructions),) if self.instructions else ()
        if isinstance(self.input, str):
            return (*system, ("user", self.input))
        return (*system, *(item.turn(f"input[{i}]") for i, item in enumerate(self.input)))

    def sampling(self) -> SamplingParams:
        fmt = None if self.text is None else self.text.format
        grammar = None if fmt is None else format_grammar(fmt.type, fmt.schema_, "text.format.schema")
        return SamplingParams(max_tokens=self.max_output_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=40, min_p=0.05, grammar=grammar)


# -- responses -------------------------------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int] = {"cached_tokens": 0}
    output_tokens: int
    output_tokens_details: dict[str, int] = {"reasoning_tokens": 0}
    total_tokens: int


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputMessage]
    parallel_tool_calls: bool = False
    previous_response_id: None = None
    store: bool = False
    temperature: float
    top_p: float
    text: dict[str, Any] = {"format": {"type": "text"}}
    tool_choice: str = "auto"
    tools: list[Any] = []
    truncation: str = "disabled"
    usage: ResponseUsage | None
    metadata: dict[str, str] = {}


def _status(finish: FinishReason | None) -> Literal["in_progress", "completed", "incomplete"]:
    return "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"


@dataclass
class ResponseRenderer(NamedEvents):
    """One response, whole or as its stream of events (``n`` is always 1)."""

    body: ResponsesRequest
    rid: str
    model: str
    created: int
    text: str = ""  # streamed so far (the ``done`` events repeat it whole)
    finish: FinishReason | None = None
    sequence: int = 0

    @property
    def item_id(self) -> str:
        return f"msg_{self.rid.removeprefix('resp_')}"

    def _item(self, text: str | None, finish: FinishReason | None) -> OutputMessage:
        return OutputMessage(id=self.item_id, status=_status(finish),
                             content=[] if text is None else [OutputText(text=text)])

    def _response(self, items: list[OutputMessage], finish: FinishReason | None,
                  usage: Usage | None) -> ResponseObject:
        b = self.body
        return ResponseObject(
            id=self.rid, created_at=self.created, status=_status(finish), instructions=b.instructions,
            incomplete_details={"reason": "max_output_tokens"} if finish == "length" else None,
            max_output_tokens=b.max_output_tokens, model=self.model, output=items, temperature=b.temperature,
            top_p=b.top_p, usage=None if usage is None else ResponseUsage(
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                input_tokens_details={"cached_tokens": usage.prompt_tokens_details.cached_tokens},
                total_tokens=usage.total_tokens))

    def _event(self, kind: str, **fields: Any) -> Event:
        self.sequence += 1
        return Event.of(kind, sequence_number=self.sequence - 1, **fields)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
        asked = f"{prompt} tokens of input" + ("" if limit is None else f" + {limit} of max_output_tokens")
        return ApiError(400, f"Your input exceeds the context window of this model ({n_ctx} tokens): {asked}. "
                             "Please adjust your input and try again.", param="input",
                        code="context_length_exceeded")

    def opening(self, n_choices: int) -> list[Event]:
        return [self._event("response.created", response=self._response([], None, None)),
                self._event("response.in_progress", response=self._response([], None, None)),
                self._event("response.output_item.added", output_index=0, item=self._item(None, None)),
                self._event("response.content_part.added", item_id=self.item_id, output_index=0, content_index=0,
                            part=OutputText(text=""))]

    def chunk(self, index: int, delta: Delta) -> list[Event]:
        out = delta.output
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        events = []
        if out.text:
            self.text += out.text
            events.append(self._event("response.output_text.delta", **where, delta=out.text, logprobs=[]))
        if out.finished:
            self.finish = out.finish_reason
            events += [self._event("response.output_text.done", **where, text=self.text, logprobs=[]),
                       self._event("response.content_part.done", **where, part=OutputText(text=self.text)),
                       self._event("response.output_item.done", output_index=0,
                                   item=self._item(self.text, self.finish))]
        return events

    def closing(self, usage: Usage) -> list[Event]:
        kind = "response.incomplete" if self.finish == "length" else "response.completed"
        return [self._event(kind, response=self._response([self._item(self.text, self.finish)], self.finish, usage))]

    def whole(self, choices: list[Choice], usage: Usage) -> ResponseObject:
        (choice,) = choices
        gen = choice.generation
        return self._response([self._item(gen.text, gen.finish_reason)], gen.finish_reason, usage)

    def failed(self, error: ApiError) -> str:
        return sse_event(self._event("error", code=error.code, message=error.message, param=error.param))


@routes.post("/v1/responses", response_model=ResponseObject)
async def create_response(body: ResponsesRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    rid = f"resp_{uuid.uuid4().hex}"
    group = service.submit([Submit(rid, body.sampling(), chat=body.turns())])
    render = ResponseRenderer(body, rid, service.model_name, int(time.time()))
    return await respond(group, render, request, body.stream, 1)
