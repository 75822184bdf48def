"""OpenAI's Responses API requests (``POST /v1/responses``): the input items as chat messages, the tools, and the
engine's parameters.

Responses is chat completions in other words, so a request is translated onto the chat machinery rather than served
by a second one: message items become chat messages; a ``function_call`` item (a call the model made earlier) becomes
an assistant message's ``tool_calls`` entry, joined to the assistant message or calls just before it as one turn;
a ``function_call_output`` item becomes a ``role: "tool"`` message. Function tools (flat: ``name``,
``parameters`` beside ``type``) become chat's :class:`~llamafleet.api.tools.Tool`, ``tool_choice`` chat's, so the
tools are shown, forced and parsed exactly as on ``/v1/chat/completions``. Hosted tools (web search, file search,
computer use, ...) need services this server does not run, and are refused by their type.

A request that continues a stored response (``previous_response_id``, see :mod:`~llamafleet.api.response_store`)
becomes one whose input is that response's conversation followed by its own items
(:meth:`ResponsesRequest.continuing`); each item is kept in the canonical shape ``GET /v1/responses/{id}/input_items``
lists (:meth:`ResponsesRequest.input_items`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_validator

from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.openai_requests import (
    ChatMessage,
    FormatType,
    chat_turns,
    constrained,
    format_grammar,
    tool_chat,
)
from llamafleet.api.protocol import DEFAULTS, Block, check_unicode
from llamafleet.api.protocol import Request as Body
from llamafleet.api.tools import (
    MAX_TOOLS,
    NAME,
    CalledFunction,
    Function,
    FunctionName,
    NamedChoice,
    Tool,
    ToolCall,
    ToolChoice,
    ToolRequest,
    calls_grammar,
    offered,
)
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import MAX_TOP_LOGPROBS, SamplingParams
from llamafleet.fleet.messages import ChatTurn

TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS = "message.output_text.logprobs"  # the ``include`` value that asks for logprobs
NOT_KEPT = ("conversation objects and stored items are not kept here: continue a stored response with "
            "'previous_response_id', or send the whole conversation in 'input'")
Status = Literal["in_progress", "completed", "incomplete"]
JsonItem = dict[str, Any]


def _item_id(prefix: str, given: str | None) -> str:
    return given or f"{prefix}_{uuid.uuid4().hex}"


def _text(content: str | list[Block], where: str) -> str:
    """The text of a string or of text parts; 400 naming the first part that is not text."""
    if isinstance(content, str):
        check_unicode([content])
        return content
    return "".join(part.text_of(f"{where}[{i}]", TEXT_PARTS) for i, part in enumerate(content))


# -- input items -----------------------------------------------------------------------------------------------
class MessageItem(Body):
    """A message: the client's, or an earlier answer sent back (its ``id``, ``status`` and the parts' annotations and
    logprobs are accepted and ignored)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Block]

    def message(self, where: str) -> ChatMessage:
        return ChatMessage(role=self.role, content=_text(self.content, f"{where}.content"))

    def stored(self, where: str) -> JsonItem:
        """The item as ``input_items`` lists it: its text as one part (the assistant's as ``output_text``)."""
        text = _text(self.content, f"{where}.content")
        part = {"type": "output_text", "text": text, "annotations": []} if self.role == "assistant" \
            else {"type": "input_text", "text": text}
        given = (self.model_extra or {}).get("id")
        return {"id": _item_id("msg", given if isinstance(given, str) else None), "type": "message",
                "role": self.role, "content": [part], "status": "completed"}


class FunctionCallItem(Body):
    """A call the model made earlier (an output item sent back as input)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Status | None = None
    # accepted, ignored
    namespace: str | None = None
    caller: dict[str, Any] | None = None

    def call(self) -> ToolCall:
        return ToolCall(id=self.call_id, type="function", function=CalledFunction(name=self.name,
                                                                                  arguments=self.arguments))

    def stored(self, where: str) -> JsonItem:
        return {"id": _item_id("fc", self.id), "type": "function_call", "call_id": self.call_id, "name": self.name,
                "arguments": self.arguments, "status": self.status or "completed"}


class FunctionCallOutputItem(Body):
    """The result of an earlier call: a ``role: "tool"`` message answering ``call_id``."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Block]
    id: str | None = None
    status: Status | None = None
    # accepted, ignored
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None

    def message(self, where: str) -> ChatMessage:
        return ChatMessage(role="tool", tool_call_id=self.call_id, content=_text(self.output, f"{where}.output"))

    def stored(self, where: str) -> JsonItem:
        return {"id": _item_id("fco", self.id), "type": "function_call_output", "call_id": self.call_id,
                "output": _text(self.output, f"{where}.output"), "status": self.status or "completed"}


class ReasoningItem(Body):
    """An earlier answer's reasoning (a ``reasoning`` output item sent back): given to the template with the
    assistant turn that follows it, which replays or drops it as the model expects."""

    model_config = ConfigDict(strict=True, extra="allow")  # summary, encrypted_content, ...: not read

    type: Literal["reasoning"]
    id: str | None = None
    content: list[Block] = []

    def text(self) -> str:
        return "".join(part.text or "" for part in self.content if part.type == "reasoning_text")

    def stored(self, where: str) -> JsonItem:
        return {"id": _item_id("rs", self.id), "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": self.text()}], "status": "completed"}


class OtherItem(Body):
    """Any other item kind, accepted here so that the refusal can name it."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str

    def refusal(self, where: str) -> ApiError:
        if self.type == "item_reference":
            return ApiError(400, f"'{where}': item references are not supported: {NOT_KEPT}", param=where)
        return ApiError(400, f"'{where}': {self.type} items are not supported; send messages, function_call and "
                             "function_call_output items", param=where)


def _item_kind(v: Any) -> str:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else "other"


Item = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                 | Annotated[ReasoningItem, Tag("reasoning")] | Annotated[OtherItem, Tag("other")],
                 Discriminator(_item_kind)]
ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[Item])


def chat_messages(items: list[Item]) -> list[ChatMessage]:
    """The chat messages of ``items``: calls join the assistant message (or calls) just before them, as one turn; a
    reasoning item's text goes with the assistant turn after it."""
    messages: list[ChatMessage] = []
    thought: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, OtherItem):
            raise item.refusal(where)
        if isinstance(item, ReasoningItem):
            thought = (thought or "") + item.text()
            continue
        if thought is not None and (isinstance(item, FunctionCallItem) or getattr(item, "role", "") == "assistant"):
            message = item.message(where) if not isinstance(item, FunctionCallItem) else \
                ChatMessage(role="assistant", content=None, tool_calls=[item.call()])
            messages.append(message.model_copy(update={"reasoning_content": thought}))
            thought = None
        elif not isinstance(item, FunctionCallItem):
            messages.append(item.message(where))
        elif messages and messages[-1].role == "assistant":
            last = messages[-1]
            messages[-1] = ChatMessage(role="assistant", content=last.content, tool_calls=[*last.tool_calls,
                                                                                          item.call()])
        else:
            messages.append(ChatMessage(role="assistant", content=None, tool_calls=[item.call()]))
    return messages


# -- tools -----------------------------------------------------------------------------------------------------
class FunctionTool(Body):
    """A function tool, Responses' flat shape of chat's ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a forced call's arguments always follow the schema, strict or not
    # accepted, ignored
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None

    def tool(self) -> Tool:
        return Tool(type="function", function=Function(name=self.name, description=self.description,
                                                       parameters=self.parameters, strict=self.strict))


class HostedTool(Body):
    """Any other tool type (web search, file search, computer use, MCP, ...), accepted here so that the refusal can
    name it."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str


def _tool_kind(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "function" if kind == "function" else "hosted"


AnyTool = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
                    Discriminator(_tool_kind)]


class FunctionChoice(Body):
    """``tool_choice`` naming a function: chat's ``{"type": "function", "function": {"name"}}``, flat."""

    type: Literal["function"]
    name: str


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


class ResponsesRequest(ToolRequest):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(DEFAULTS.temperature, ge=0.0, le=2.0)
    top_p: float = Field(DEFAULTS.top_p, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[AnyTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | dict[str, Any] = Field(
        "auto", union_mode="left_to_right")
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] = []
    previous_response_id: str | None = None
    store: bool | None = None  # null = true, OpenAI's default: the response is kept for previous_response_id
    conversation: str | dict[str, Any] | None = None
    background: bool = False
    prompt: dict[str, Any] | None = None
    # its "effort" goes to the chat template (see template_kwargs), its "max_tokens" (OpenRouter's name) is the budget
    reasoning: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # accepted, ignored: nothing is billed here, and max_tool_calls bounds calls of hosted tools, none of which run
    # here
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    max_tool_calls: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
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
            ("conversation", self.conversation is not None, NOT_KEPT),
            ("background", self.background, "every response is answered while the request waits"),
            ("prompt", self.prompt is not None, "stored prompt templates are not kept here; send the text"),
        ]

    @property
    def stored(self) -> bool:
        """Whether the response is to be kept (``store`` true or left out)."""
        return self.store is not False

    def input_items(self) -> tuple[JsonItem, ...]:
        """This request's input as the items ``input_items`` lists (a string input is one user message); 400 naming
        the first item or part that cannot be read."""
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        stored = []
        for i, item in enumerate(items):
            if isinstance(item, OtherItem):
                raise item.refusal(f"input[{i}]")
            stored.append(item.stored(f"input[{i}]"))
        return tuple(stored)

    def continuing(self, conversation: Sequence[JsonItem]) -> ResponsesRequest:
        """This request with ``conversation`` (stored items, this request's own last) as its whole input."""
        return self.model_copy(update={"input": ITEMS.validate_python(list(conversation))})

    @property
    def logprobs(self) -> bool:
        """Whether the answer's tokens come with their logprobs: asked for by ``include``, or implied by asking for
        top alternatives."""
        return LOGPROBS in self.include or self.top_logprobs > 0

    def choice(self) -> ToolChoice:
        """Chat's ``tool_choice`` for this one; 400 naming a hosted tool's or another kind of choice."""
        tc = self.tool_choice
        if isinstance(tc, FunctionChoice):
            return NamedChoice(type="function", function=FunctionName(name=tc.name))
        if isinstance(tc, dict):
            raise ApiError(400, f"'tool_choice': {tc.get('type')!r} choices are not supported; send \"auto\", "
                                "\"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
                           param="tool_choice")
        return tc

    @cached_property
    def callable(self) -> list[Tool]:
        """The tools the model may call (:func:`~llamafleet.api.tools.offered`); their calls are parsed out. A hosted
        tool is a 400 naming its type."""
        tools = []
        for i, t in enumerate(self.tools):
            if isinstance(t, HostedTool):
                raise ApiError(400, f"'tools[{i}]': {t.type} tools are not supported: this server runs no hosted "
                                    "tools; send function tools (type \"function\"), which your code runs",
                               param=f"tools[{i}]")
            tools.append(t.tool())
        return offered(tools, self.choice())

    @property
    def forced(self) -> bool:
        """Whether the answer must be tool calls (``tool_choice`` "required" or a named function)."""
        return self.tool_choice != "auto" and bool(self.callable)

    @cached_property
    def messages(self) -> list[ChatMessage]:
        """The conversation as chat messages, ``instructions`` first as a system message."""
        system = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        items = [ChatMessage(role="user", content=self.input)] if isinstance(self.input, str) \
            else chat_messages(self.input)
        return [*system, *items]

    def turns(self) -> tuple[ChatTurn, ...]:
        """The (role, content) turns for the model's chat template, the callable tools listed in the system prompt,
        as chat's."""
        return chat_turns(self.messages, self.callable)

    def tool_chat(self) -> ToolChat | None:
        """The same conversation for a model whose own template shows tools or is of a known family, as chat's."""
        effort = (self.reasoning or {}).get("effort")
        kwargs = self.template_kwargs(self.chat_template_kwargs, effort if isinstance(effort, str) else None,
                                      "chat_template_kwargs")
        return tool_chat(self.messages, self.callable, self.family, kwargs)

    def sampling(self) -> SamplingParams:
        fmt = None if self.text is None else self.text.format
        grammar = None if fmt is None else format_grammar(fmt.type, fmt.schema_, "text.format.schema", self.family)
        if self.forced:
            if grammar is not None:
                raise ApiError(400, "a forced tool call ('tool_choice' \"required\" or a function) cannot be "
                                    "combined with a JSON 'text.format'; send one", param="tool_choice")
            grammar = calls_grammar(self.callable, self.tool_choice == "required" and self.parallel_tool_calls,
                                    self.family)
        return SamplingParams(max_tokens=self.max_output_tokens, temperature=self.temperature, top_p=self.top_p,
                              logprobs=self.logprobs, top_logprobs=self.top_logprobs,
                              grammar=constrained(grammar, self.grammar, False, "text.format"),
                              think_budget=self.think_budget())

    def think_budget(self) -> int | None:
        """``reasoning.max_tokens``, else that of ``reasoning.effort``, or the server's budget."""
        given, effort = (self.reasoning or {}).get("max_tokens"), (self.reasoning or {}).get("effort")
        if given is not None and (not isinstance(given, int) or isinstance(given, bool)):
            raise ApiError(400, "'reasoning.max_tokens' must be an integer", param="reasoning.max_tokens")
        return self.budget(given, self.max_output_tokens, "reasoning.max_tokens", effort if effort is None else
                           str(effort), "reasoning.effort")
