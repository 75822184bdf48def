"""Anthropic's Messages API requests (``POST /v1/messages`` and ``count_tokens``): the conversation as chat turns
for the model's template, and the engine's parameters.

Text blocks are joined; earlier turns' thinking is skipped. Tools are OpenAI's tools in Anthropic's words, translated
to :mod:`~llamafleet.api.tools`' objects rather than rebuilt: ``tools`` (``input_schema`` for ``parameters``) are
shown as chat's are (the model's own template, or the generic system-prompt section), ``tool_choice`` ``any`` /
``tool`` force a call under the same grammar as ``"required"`` / a named function, and earlier ``tool_use`` /
``tool_result`` blocks become OpenAI's assistant tool calls and ``role: "tool"`` messages
(:class:`~llamafleet.api.chat_messages.ChatMessage`), rendered as chat's are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from llamafleet.api.chat_messages import ChatMessage, chat_turns, tool_chat
from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.protocol import DEFAULTS, Block, check_stops, check_unicode
from llamafleet.api.protocol import Request as Body
from llamafleet.api.structured import constrained
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
from llamafleet.engine.types import SamplingParams
from llamafleet.fleet.messages import ChatTurn

SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier turns' reasoning: given to the template apart
TOOL_ERROR = "Error: "  # what a tool_result with is_error: true is prefixed with


def _text(content: str | Sequence[Block | ToolUse | ToolResult], where: str) -> str:
    """The text of a string or of content blocks, tool blocks left out; 400 naming the first other block that is
    not text."""
    if isinstance(content, str):
        return content
    return "".join(block.text_of(f"{where}[{i}]", ("text",)) for i, block in enumerate(content)
                   if isinstance(block, Block) and block.type not in SKIPPED_BLOCKS)


class ToolUse(Body):
    """An assistant's earlier call: OpenAI's :class:`~llamafleet.api.tools.ToolCall` in Anthropic's words."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None

    def call(self) -> ToolCall:
        return ToolCall(id=self.id, type="function",
                        function=CalledFunction(name=self.name, arguments=json.dumps(self.input, ensure_ascii=False)))


class ToolResult(Body):
    """A call's result, sent in a user message: rendered as OpenAI's ``role: "tool"`` message is."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Block] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None

    def message(self, where: str) -> ChatMessage:
        text = _text(self.content, f"{where}.content")
        return ChatMessage(role="tool", tool_call_id=self.tool_use_id, content=TOOL_ERROR + text if self.is_error
                           else text)


def _block_kind(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in ("tool_use", "tool_result") else "other"


AnyBlock = Annotated[Annotated[ToolUse, Tag("tool_use")] | Annotated[ToolResult, Tag("tool_result")]
                    | Annotated[Block, Tag("other")], Discriminator(_block_kind)]


class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    content: str | list[AnyBlock]

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[AnyBlock]) -> str | list[AnyBlock]:
        if isinstance(v, str):
            check_unicode([v])
        return v

    @model_validator(mode="after")
    def _tool_blocks_in_their_roles(self) -> AnthropicMessage:
        kinds = {b.type for b in self.content} if isinstance(self.content, list) else set()
        if self.role == "user" and "tool_use" in kinds:
            raise ValueError("tool_use blocks belong in assistant messages (the calls the assistant made)")
        if self.role == "assistant" and "tool_result" in kinds:
            raise ValueError("tool_result blocks belong in user messages (the results of the assistant's calls)")
        return self

    def messages(self, where: str) -> list[ChatMessage]:
        """The chat messages of this message: an assistant's text and its calls as one message; a user's tool
        results each as OpenAI's tool message, then its text; 400 naming a block that is neither."""
        if isinstance(self.content, str):
            return [ChatMessage(role=self.role, content=self.content)]
        calls = [b.call() for b in self.content if isinstance(b, ToolUse)]
        results = [b.message(f"{where}[{i}]") for i, b in enumerate(self.content) if isinstance(b, ToolResult)]
        text = _text(self.content, where)
        thought = "".join(str(getattr(b, "thinking", "")) for b in self.content
                          if isinstance(b, Block) and b.type == "thinking") or None
        if calls or (thought and self.role == "assistant"):  # the template replays or drops the thinking
            return [ChatMessage(role="assistant", content=text or None if calls else text, tool_calls=calls,
                                reasoning_content=thought)]
        return results + ([ChatMessage(role=self.role, content=text)] if text or not results else [])


class AnthropicTool(Body):
    """A client tool: OpenAI's function tool in Anthropic's words (``input_schema`` for ``parameters``)."""

    name: str = Field(pattern=NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: bool | None = None  # a forced call's input always follows the schema, strict or not
    cache_control: dict[str, Any] | None = None

    def tool(self) -> Tool:
        return Tool(type="function", function=Function(name=self.name, description=self.description,
                                                       parameters=self.input_schema))


class AnthropicToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    def choice(self) -> ToolChoice:
        """OpenAI's ``tool_choice`` for this one: ``any`` is ``"required"``, ``tool`` a named function."""
        if self.type == "tool":
            if self.name is None:
                raise ApiError(400, "'tool_choice.name' is required with type \"tool\": name the tool to call",
                               param="tool_choice.name")
            return NamedChoice(type="function", function=FunctionName(name=self.name))
        return "required" if self.type == "any" else self.type


class CountTokensRequest(ToolRequest):
    """What ``count_tokens`` and ``messages`` share: the conversation, and the options about it."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] = ""
    tools: list[AnthropicTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice = AnthropicToolChoice(type="auto")
    output_config: dict[str, Any] = {}
    mcp_servers: list[Any] = []
    thinking: dict[str, Any] | None = None  # {"type": "enabled" | "disabled", ...}: enable_thinking for the template
    chat_template_kwargs: dict[str, Any] | None = None
    # accepted, ignored: no prompt cache to control (nothing is billed)
    cache_control: dict[str, Any] | None = None

    @cached_property
    def callable(self) -> list[Tool]:
        """The tools the model may call (:func:`~llamafleet.api.tools.offered`); their calls are parsed out."""
        return offered([t.tool() for t in self.tools], self.tool_choice.choice())

    @property
    def forced(self) -> bool:
        """Whether the answer must be calls (``tool_choice`` ``any`` or ``tool``)."""
        return self.tool_choice.type in ("any", "tool") and bool(self.callable)

    @cached_property
    def conversation(self) -> list[ChatMessage]:
        """The conversation as OpenAI's chat messages (400 naming a block that is not text or a tool's)."""
        system = _text(self.system, "system")
        chat = [c for i, m in enumerate(self.messages) for c in m.messages(f"messages[{i}].content")]
        return [ChatMessage(role="system", content=system), *chat] if system else chat

    def turns(self) -> tuple[ChatTurn, ...]:
        """The chat turns for the model's template, the callable tools listed in the system prompt, as chat's."""
        return chat_turns(self.conversation, self.callable)

    def tool_chat(self) -> ToolChat | None:
        """The same conversation for a model whose own template shows tools or is of a known family, as chat's;
        ``thinking`` turns the template's thinking on or off (``enable_thinking``, or the family's own switch)."""
        kind = (self.thinking or {}).get("type")
        kwargs = self.template_kwargs(self.chat_template_kwargs, None, "chat_template_kwargs",
                                      kind == "enabled" if kind in ("enabled", "disabled") else None,
                                      self.think_budget())
        return tool_chat(self.conversation, self.callable, self.family, kwargs)

    def not_yet(self) -> NotYet:
        """The parameters that need features not built yet (see :func:`~llamafleet.api.errors.refuse_unbuilt`)."""
        return [
            ("output_config.format", "format" in self.output_config, "structured output is served on "
             "/v1/chat/completions (response_format) and /v1/responses (text.format), not on this route yet"),
            ("mcp_servers", bool(self.mcp_servers), "this server connects to no MCP server"),
        ]

    def token_limit(self) -> int | None:
        """The answer's token limit (none to count tokens)."""
        return None

    def think_budget(self) -> int | None:
        """``thinking.budget_tokens`` (with ``type: "enabled"``), or the server's budget."""
        given = (self.thinking or {}).get("budget_tokens") if (self.thinking or {}).get("type") == "enabled" \
            else None
        if given is not None and not isinstance(given, int):
            raise ApiError(400, "'thinking.budget_tokens' must be an integer", param="thinking.budget_tokens")
        return self.budget(given, self.token_limit(), "thinking.budget_tokens")


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] = []
    stream: bool = False
    temperature: float = Field(DEFAULTS.temperature, ge=0.0, le=1.0)
    top_p: float = Field(DEFAULTS.top_p, gt=0.0, le=1.0)
    top_k: int = Field(DEFAULTS.top_k, ge=0, lt=2**31)
    # accepted, ignored
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    def token_limit(self) -> int | None:
        return self.max_tokens

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str]) -> list[str]:
        check_stops(v)
        return v

    def sampling(self) -> SamplingParams:
        """The engine's parameters; with stop sequences, the tokens' pieces too (to tell which one matched)."""
        many = self.tool_choice.type == "any" and not self.tool_choice.disable_parallel_tool_use
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, stop=tuple(self.stop_sequences),
                              logprobs=bool(self.stop_sequences),
                              grammar=constrained(calls_grammar(self.callable, many, self.family) if self.forced
                                                  else None, self.grammar, False, "tool_choice"),
                              think_budget=self.think_budget())
