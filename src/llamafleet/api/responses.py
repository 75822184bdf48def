"""OpenAI's Responses API: ``POST /v1/responses`` (the SDK's ``client.responses.create``).

A request (:mod:`~llamafleet.api.responses_requests`) becomes the same chat turns a chat completion's messages do, so
it runs through the model's own chat template, with tools shown, forced and parsed by the chat machinery. The answer
is a ``response`` object whose ``output`` holds an assistant message (its text as one ``output_text`` part), then
one ``function_call`` item per tool call; a stream sends the API's named events, each with its ``sequence_number``.
The model's thinking (:mod:`~llamafleet.api.answer`) comes first, as a ``reasoning`` item whose ``content`` holds
one ``reasoning_text`` (streamed as ``response.reasoning_text.delta`` events). With tools or reasoning the message
item is opened only once there is text to send (a call may come first, and a forced answer has none), and each call
is its own item, added once the model names its function (``response.output_item.added``), its arguments streamed
as they are written (``response.function_call_arguments.delta``), done when the answer ends (``.done``,
``response.output_item.done``); items are numbered in the order they were added.
A finished response is kept (unless ``store`` is false) for ``previous_response_id`` and the ``GET``/``DELETE``
routes, by its API key (:mod:`~llamafleet.api.response_store`); ``conversation`` objects are refused. Logprobs
(``include: ["message.output_text.logprobs"]``, ``top_logprobs``) go on the ``output_text`` part, and on each text
delta for the tokens its text came from.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from llamafleet.api.aggregate import Choice, respond
from llamafleet.api.answer import AnswerStreams, Split
from llamafleet.api.call_stream import CallPiece
from llamafleet.api.errors import ApiError, refuse_unbuilt
from llamafleet.api.logprobs import chat_logprobs
from llamafleet.api.protocol import Event, NamedEvents, TokenLogprob, Usage, sse_event
from llamafleet.api.response_store import owner_of
from llamafleet.api.responses_items import Status
from llamafleet.api.responses_requests import ResponsesRequest
from llamafleet.api.service import ServiceDep
from llamafleet.api.tool_calls import ParsedCall, call_id
from llamafleet.engine.types import ContextOverflow, FinishReason
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()


# -- responses -------------------------------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[TokenLogprob] = []  # with include ["message.output_text.logprobs"] or top_logprobs


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    """A tool call: ``call_id`` is what the ``function_call_output`` item that answers it names."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    status: Status

    @classmethod
    def of(cls, call: ParsedCall) -> FunctionCallOut:
        return cls(id=f"fc_{uuid.uuid4().hex}", call_id=call.id or call_id(), name=call.name,
                   arguments=call.arguments, status="completed")


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The model's thinking, before the message."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[ReasoningText]
    status: Status


OutputItem = ReasoningItem | OutputMessage | FunctionCallOut


class ResponseUsage(BaseModel):
    """``cache_write_tokens`` (billed cache writes, a field the SDK requires) is 0: nothing is billed here."""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int] = {"reasoning_tokens": 0}
    total_tokens: int


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    error: None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    store: bool = True
    temperature: float
    top_p: float
    text: dict[str, Any] = {"format": {"type": "text"}}
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_logprobs: int
    truncation: str = "disabled"
    usage: ResponseUsage | None
    metadata: dict[str, str] = {}


def _status(finish: FinishReason | None) -> Status:
    return "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"


@dataclass
class ResponseRenderer(NamedEvents):
    """One response, whole or as its stream of events (``n`` is always 1). Without tools the message item opens
    with the stream; with tools (``calls``), once there is text."""

    body: ResponsesRequest
    rid: str
    model: str
    created: int
    answers: AnswerStreams | None = None  # splits reasoning and calls out of the answer (None: all is text)
    keep: Callable[[ResponseObject], None] | None = None  # stores the finished response (None: store is false)
    text: str = ""  # streamed so far (the ``done`` events repeat it whole)
    thought: str = ""  # the reasoning streamed so far
    reasoned: bool = False  # the reasoning item was added (it is output 0)
    thinking: bool = False  # ... and is not done yet
    logprobs: list[TokenLogprob] = field(default_factory=list)  # streamed so far, likewise
    unsent: int = 0  # how many of them no text delta has carried yet (their text is held back)
    opened: bool = False  # the message item was added
    message_at: int = 0  # ... as the output item of that index
    items: list[FunctionCallOut] = field(default_factory=list)  # the calls, as they are streamed
    finish: FinishReason | None = None
    sequence: int = 0

    @property
    def item_id(self) -> str:
        return f"msg_{self.rid.removeprefix('resp_')}"

    def _message(self, text: str | None, finish: FinishReason | None,
                 logprobs: list[TokenLogprob] | None = None) -> OutputMessage:
        return OutputMessage(id=self.item_id, status=_status(finish),
                             content=[] if text is None else [OutputText(text=text, logprobs=logprobs or [])])

    def _response(self, items: list[OutputItem], finish: FinishReason | None,
                  usage: Usage | None) -> ResponseObject:
        b = self.body
        return ResponseObject(
            id=self.rid, created_at=self.created, status=_status(finish), instructions=b.instructions,
            incomplete_details={"reason": "max_output_tokens"} if finish == "length" else None,
            max_output_tokens=b.max_output_tokens, model=self.model, output=items, temperature=b.temperature,
            previous_response_id=b.previous_response_id, store=self.keep is not None,
            top_p=b.top_p, parallel_tool_calls=b.parallel_tool_calls, top_logprobs=b.top_logprobs,
            tool_choice=b.model_dump(include={"tool_choice"})["tool_choice"],
            tools=[t.model_dump(exclude_none=True) for t in b.tools],
            usage=None if usage is None else ResponseUsage(
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                input_tokens_details={"cached_tokens": usage.prompt_tokens_details.cached_tokens,
                                      "cache_write_tokens": 0},
                total_tokens=usage.total_tokens))

    @property
    def reasoning_id(self) -> str:
        return f"rs_{self.rid.removeprefix('resp_')}"

    def _reasoning(self, text: str, status: Status) -> ReasoningItem:
        return ReasoningItem(id=self.reasoning_id, status=status, content=[ReasoningText(text=text)] if text else [])

    def _output(self, text: str | None, calls: list[FunctionCallOut], finish: FinishReason | None,
                logprobs: list[TokenLogprob], thought: str = "") -> list[OutputItem]:
        """The output items: the reasoning (when there is some), the message (when there is text, or no call), then
        the calls."""
        reasoning: list[OutputItem] = [self._reasoning(thought, "completed")] if thought else []
        message: list[OutputItem] = [self._message(text or "", finish, logprobs)] if text or not calls else []
        return [*reasoning, *message, *calls]

    def _think(self, text: str) -> list[Event]:
        """Reasoning ``text`` streamed, the reasoning item added first."""
        events = []
        if not self.reasoned:
            self.reasoned = self.thinking = True
            events.append(self._event("response.output_item.added", output_index=0,
                                      item=self._reasoning("", "in_progress")))
        self.thought += text
        return events + [self._event("response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0,
                                     content_index=0, delta=text)]

    def _thought(self) -> list[Event]:
        """The reasoning item, done (once the message or a call follows, or the answer ends)."""
        if not self.thinking:
            return []
        self.thinking = False
        item = self._reasoning(self.thought, "completed")
        return [self._event("response.reasoning_text.done", item_id=item.id, output_index=0, content_index=0,
                            text=self.thought),
                self._event("response.output_item.done", output_index=0, item=item)]

    def _event(self, kind: str, **fields: Any) -> Event:
        self.sequence += 1
        return Event.of(kind, sequence_number=self.sequence - 1, **fields)

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        n_ctx, prompt, limit = overflow.n_ctx, overflow.prompt_tokens, overflow.max_tokens
        asked = f"{prompt} tokens of input" + ("" if limit is None else f" + {limit} of max_output_tokens")
        return ApiError(400, f"Your input exceeds the context window of this model ({n_ctx} tokens): {asked}. "
                             "Please adjust your input and try again.", param="input",
                        code="context_length_exceeded")

    def _open(self) -> list[Event]:
        """The message item and its one text part, added (after the reasoning, done)."""
        events = self._thought()
        self.opened = True
        at = self.message_at = int(self.reasoned) + len(self.items)
        return events + [
            self._event("response.output_item.added", output_index=at, item=self._message(None, None)),
            self._event("response.content_part.added", item_id=self.item_id, output_index=at, content_index=0,
                        part=OutputText(text=""))]

    def _call_at(self, index: int) -> int:
        """The output index of call ``index`` (the calls' items follow the reasoning, the message among them)."""
        return int(self.reasoned) + index + int(self.opened and self.message_at <= int(self.reasoned) + index)

    def _piece(self, piece: CallPiece) -> list[Event]:
        """A call's item added (at its first piece, with no arguments yet), then the piece of its arguments."""
        events = []
        if piece.name is not None:
            events += self._thought()
            call = FunctionCallOut.of(ParsedCall(piece.name, "", piece.id))
            self.items.append(call)
            events.append(self._event("response.output_item.added", output_index=self._call_at(piece.index),
                                      item=call.model_copy(update={"status": "in_progress"})))
        call = self.items[piece.index]
        call.arguments += piece.arguments
        return events + [self._event("response.function_call_arguments.delta", item_id=call.id,
                                     output_index=self._call_at(piece.index), delta=piece.arguments)]

    def _call_done(self, index: int) -> list[Event]:
        call, at = self.items[index], self._call_at(index)
        return [self._event("response.function_call_arguments.done", output_index=at, item_id=call.id,
                            arguments=call.arguments),
                self._event("response.output_item.done", output_index=at, item=call)]

    def opening(self, n_choices: int) -> list[Event]:
        events = [self._event("response.created", response=self._response([], None, None)),
                  self._event("response.in_progress", response=self._response([], None, None))]
        return events + (self._open() if self.answers is None else [])

    def chunk(self, index: int, delta: Delta) -> list[Event]:
        out = delta.output
        said = Split(content=out.text) if self.answers is None else \
            self.answers.feed(0, out.text, out.finished, out.finish_reason == "length")
        text = said.content
        lps = chat_logprobs(delta.pieces or [], out)
        if lps is not None:
            self.logprobs += lps.content
            self.unsent += len(lps.content)
        events = self._think(said.reasoning) if said.reasoning else []
        for piece in said.pieces:
            events += self._piece(piece)
        if not self.opened and (text or (out.finished and not self.items)):
            events += self._open()
        where = {"item_id": self.item_id, "output_index": self.message_at, "content_index": 0}
        if text:
            self.text += text
            carried = self.logprobs[len(self.logprobs) - self.unsent:]
            self.unsent = 0
            events.append(self._event("response.output_text.delta", **where, delta=text, logprobs=carried))
        if out.finished:
            self.finish = out.finish_reason
            events += self._thought()
            if self.opened:
                part = OutputText(text=self.text, logprobs=self.logprobs)
                events += [self._event("response.output_text.done", **where, text=self.text,
                                       logprobs=self.logprobs),
                           self._event("response.content_part.done", **where, part=part),
                           self._event("response.output_item.done", output_index=self.message_at,
                                       item=self._message(self.text, self.finish, self.logprobs))]
            for i in range(len(self.items)):
                events += self._call_done(i)
        return events

    def _kept(self, response: ResponseObject) -> ResponseObject:
        if self.keep is not None:
            self.keep(response)
        return response

    def closing(self, usage: Usage) -> list[Event]:
        kind = "response.incomplete" if self.finish == "length" else "response.completed"
        output = self._output(self.text if self.opened else None, self.items, self.finish, self.logprobs, self.thought)
        if self.opened and self.items:  # the message where it was added among the calls
            message = output.pop(int(self.reasoned))
            output.insert(self.message_at, message)
        return [self._event(kind, response=self._kept(self._response(output, self.finish, usage)))]

    def whole(self, choices: list[Choice], usage: Usage) -> ResponseObject:
        (choice,) = choices
        gen = choice.generation
        part = Split(content=gen.text) if self.answers is None else \
            self.answers.whole(gen.text, gen.finish_reason == "length")
        lps = chat_logprobs(choice.pieces, gen)
        output = self._output(part.content, [FunctionCallOut.of(c) for c in part.calls], gen.finish_reason,
                              [] if lps is None else lps.content, part.reasoning)
        return self._kept(self._response(output, gen.finish_reason, usage))

    def failed(self, error: ApiError) -> str:
        return sse_event(self._event("error", code=error.code, message=error.message, param=error.param))


@routes.post("/v1/responses", response_model=ResponseObject)
async def create_response(body: ResponsesRequest, request: Request, service: ServiceDep) -> Response:
    service = await service.for_model(body.model)
    refuse_unbuilt(body.not_yet())
    store, owner = service.responses, owner_of(request.scope)
    previous = body.previous_response_id
    history = () if previous is None else store.get(previous, owner, "previous_response_id").conversation
    inputs = (*history, *body.input_items())
    body = body.continuing(inputs) if history else body
    rid = f"resp_{uuid.uuid4().hex}"
    body.served_by(service.model_serving)

    def keep(response: ResponseObject) -> None:
        store.put(rid, owner, response.model_dump(), inputs)

    group = service.submit([Submit(rid, body.sampling(), chat=body.turns(), tools=body.tool_chat())])
    answers = AnswerStreams.over(service.family, body.callable, body.forced)
    render = ResponseRenderer(body, rid, service.model_name, int(time.time()), answers,
                              keep if body.stored else None)
    return await respond(group, render, request, body.stream, 1)


@routes.get("/v1/responses/{rid}", response_model=ResponseObject)
async def get_response(rid: str, request: Request, service: ServiceDep, stream: bool = False) -> JSONResponse:
    """A stored response as it finished (``stream=true`` would replay its events: not kept, so refused)."""
    if stream:
        raise ApiError(400, "'stream': stored responses are kept whole, not as their events; retrieve without "
                            "stream", param="stream", code="unsupported_parameter")
    return JSONResponse(service.responses.get(rid, owner_of(request.scope)).response)


@routes.delete("/v1/responses/{rid}")
async def delete_response(rid: str, request: Request, service: ServiceDep) -> dict[str, Any]:
    service.responses.delete(rid, owner_of(request.scope))
    return {"id": rid, "object": "response.deleted", "deleted": True}


@routes.get("/v1/responses/{rid}/input_items")
async def input_items(rid: str, request: Request, service: ServiceDep, limit: int = Query(20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc", after: str | None = None,
                      before: str | None = None) -> dict[str, Any]:
    """The items a stored response was generated from (the conversation it continued first), a page at a time:
    ``limit`` items after the item ``after`` (or before ``before``) in ``order``."""
    items = list(service.responses.get(rid, owner_of(request.scope)).inputs)
    if order == "desc":
        items.reverse()
    ids = [item["id"] for item in items]
    for cursor, param in ((after, "after"), (before, "before")):
        if cursor is not None and cursor not in ids:
            raise ApiError(400, f"'{param}': no input item '{cursor}' in response '{rid}'", param=param)
    start = 0 if after is None else ids.index(after) + 1
    end = len(items) if before is None else ids.index(before)
    page = items[start:end][:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + len(page) < end}
