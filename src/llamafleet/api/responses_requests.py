"""OpenAI's Responses API requests (``POST /v1/responses``): the request, its tools, and the engine's parameters; its
input items are :mod:`~llamafleet.api.responses_items`.

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

from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from llamafleet.api.chat_messages import ChatMessage, chat_turns, tool_chat
from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.protocol import DEFAULTS, check_unicode
from llamafleet.api.protocol import Request as Body
from llamafleet.api.responses_items import (
    ITEMS,
    NOT_KEPT,
    Item,
    JsonItem,
    MessageItem,
    OtherItem,
    chat_messages,
)
from llamafleet.api.structured import FormatType, constrained, format_grammar
from llamafleet.api.tools import (
    MAX_TOOLS,
    NAME,
    Function,
    FunctionName,
    NamedChoice,
    Tool,
    ToolChoice,
    ToolRequest,
    calls_grammar,
    offered,
)
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import MAX_TOP_LOGPROBS, SamplingParams
from llamafleet.fleet.messages import ChatTurn

LOGPROBS = "message.output_text.logprobs"  # the ``include`` value that asks for logprobs


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
                                      "chat_template_kwargs", budget=self.think_budget())
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
