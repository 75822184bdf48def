"""OpenAI function tools on the way in: the request shapes, the prompt that shows them to the model, and the grammar
that forces a call when ``tool_choice`` demands one.

A model whose GGUF carries a Jinja template that shows tools gets the conversation in its own template's words: the
request sends it whole (:class:`~llamafleet.engine.template.ToolChat`: :meth:`Tool.spec`, :meth:`ToolCall.
template_call`) and the worker renders it (:mod:`~llamafleet.engine.template`). Every other model is rendered by
llama.cpp's built-in template families (``llama_chat_apply_template``), which know nothing of tools; for those, tools
are shown the way Hermes 2 Pro and Qwen templates show them, as plain text any model can read: a section added to the
system prompt (:func:`tools_prompt`) that lists each function's name, description and JSON-schema parameters and
asks for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks. Earlier calls are rendered as those
blocks in the assistant's turn, and tool results as ``<tool_response>`` blocks in a user turn (every template family
accepts the user role), so a conversation reads the same way it was asked for. Both renderings go with every request
that has tools; the worker picks.

``tool_choice`` ``"required"`` or a named function samples under a GBNF grammar (:func:`calls_grammar`) whose every
sentence is one or more such blocks, each naming an offered function, with arguments valid under its schema
(:func:`~llamafleet.engine.grammar.json_schema_grammar`). ``"auto"`` samples freely and parses what comes
(:mod:`~llamafleet.api.tool_calls`); ``"none"`` neither lists the tools nor parses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from llamafleet.api.call_grammar import format_calls
from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import Request, checked_grammar
from llamafleet.engine.families import FAMILIES, Family
from llamafleet.engine.grammar import after_thinking

MAX_TOOLS = 128
MAX_PARALLEL_CALLS = 8  # calls one forced answer may hold (``tool_choice: "required"``)
NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call>"
)


class Function(Request):
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a forced call's arguments always follow the schema, strict or not

    def arguments_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else {"type": "object", "properties": {}}


class Tool(Request):
    type: Literal["function"]
    function: Function

    def spec(self) -> dict[str, Any]:
        """The tool as chat templates show it: ``{"type": "function", "function": {name, description, parameters}}``."""
        return {"type": "function", "function": self.function.model_dump(exclude={"strict"}, exclude_none=True)}


class FunctionName(Request):
    name: str


class NamedChoice(Request):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


class CalledFunction(Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Request):
    """An assistant's earlier call, sent back in the conversation."""

    id: str
    type: Literal["function"]
    function: CalledFunction

    def template_call(self) -> dict[str, Any]:
        """The call as chat templates read it: its arguments as the object they spell (HF's convention)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": _arguments(self.function.arguments)}}


def call_block(name: str, arguments: Any) -> str:
    """One call as the model is asked to write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


def _arguments(text: str) -> Any:
    """A past call's arguments as JSON (shown as the object they spell; as the text itself if they spell none)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def tools_prompt(tools: list[Tool]) -> str:
    """The system-prompt section that lists ``tools`` and the format of a call."""
    specs = [json.dumps(t.spec(), ensure_ascii=False) for t in tools]
    return TOOLS_HEADER + "\n".join(specs) + TOOLS_FOOTER


def with_tools(turns: list[tuple[str, str]], tools: list[Tool]) -> tuple[tuple[str, str], ...]:
    """The (role, content) turns with ``tools`` listed (:func:`tools_prompt`) at the end of the system prompt, which
    is added when the conversation has none; unchanged when no tool can be called."""
    if not tools:
        return tuple(turns)
    section = tools_prompt(tools)
    if turns and turns[0][0] == "system":
        return (("system", f"{turns[0][1]}\n\n{section}"), *turns[1:])
    return (("system", section), *turns)


def assistant_text(content: str, calls: list[ToolCall]) -> str:
    """An assistant turn that made ``calls``: its text, then one block per call."""
    blocks = [call_block(c.function.name, _arguments(c.function.arguments)) for c in calls]
    return "\n".join([content, *blocks] if content else blocks)


def tool_result_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def offered(tools: list[Tool], choice: ToolChoice, param: str = "tool_choice") -> list[Tool]:
    """The tools the model may call under ``choice`` (none for ``"none"``; the named one alone)."""
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ApiError(400, "'tools': function names must be unique", param="tools")
    if choice == "none":
        return []
    if not tools and choice != "auto":
        raise ApiError(400, f"'{param}' needs 'tools' to call; send tools or \"auto\"/\"none\"", param=param)
    if isinstance(choice, NamedChoice):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise ApiError(400, f"'{param}': no function named {choice.function.name!r} in 'tools'; name one of "
                                f"{', '.join(names)}", param=param)
        return named
    return tools


def calls_grammar(tools: list[Tool], many: bool, family: Family | None = None) -> str:
    """GBNF for one call (``many`` false) or up to :data:`MAX_PARALLEL_CALLS` calls of ``tools`` in ``family``'s
    own call format, after its optional think block (:mod:`~llamafleet.api.call_grammar`); a model of no known
    family writes this server's ``<tool_call>`` blocks, whose JSON names one of the tools and holds arguments valid
    under its parameters schema."""
    schemas = [(t.function.name, t.function.arguments_schema()) for t in tools]
    grammar = format_calls(family or FAMILIES["hermes"], schemas, MAX_PARALLEL_CALLS if many else 1)
    if family is None:
        return after_thinking(grammar, None)
    return after_thinking(grammar, family.think, bare=family.bare_close)


@dataclass(frozen=True)
class Serving:
    """What a chat route knows of the model that answers it: its family, and the server's defaults for reasoning
    (``reasoning_budget``, ``chat_template_kwargs`` in the configuration)."""

    family: Family | None = None
    reasoning_budget: int | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    context: int | None = None  # tokens of context per sequence (an answer's limit when the request sets none)


RESERVED_KWARGS = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
# a reasoning effort as the share of the answer's token limit its think block may take (OpenRouter's shares; "none":
# the block closed after its first token)
EFFORTS = {"none": 0.0, "minimal": 0.1, "low": 0.2, "medium": 0.5, "high": 0.8, "xhigh": 0.95, "max": 0.95}


class ToolRequest(Request):
    """A chat request of any dialect, whose answer may call tools and reason: the route tells it what serves it
    (:meth:`served_by`) once the model is known, before its grammar, budget and template variables are built."""

    _serving: Serving = PrivateAttr(Serving())
    grammar: str | None = None  # GBNF, start rule "root" (llama.cpp's extension): the answer is a sentence of it

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, v: str | None) -> str | None:
        return checked_grammar(v)

    def served_by(self, serving: Serving) -> None:
        self._serving = serving

    @property
    def family(self) -> Family | None:
        return self._serving.family

    def budget(self, given: int | None, max_tokens: int | None, param: str, effort: str | None = None,
               effort_param: str = "reasoning_effort") -> int | None:
        """The reasoning budget: ``given`` (the request's ``param``), else that of its reasoning ``effort``
        (``effort_param``: :meth:`effort_budget`), else the server's; 400 when it is not from 1 to ``max_tokens``."""
        if given is None and effort is not None:
            return self.effort_budget(effort, max_tokens, effort_param)
        if given is None:
            default = self._serving.reasoning_budget
            return None if default is None or (max_tokens is not None and default > max_tokens) else default
        if given < 1 or (max_tokens is not None and given > max_tokens):
            limit = "" if max_tokens is None else f" and at most the answer's token limit ({max_tokens})"
            raise ApiError(400, f"'{param}' must be at least 1{limit}, not {given}", param=param)
        return given

    def effort_budget(self, effort: str, max_tokens: int | None, param: str) -> int | None:
        """The budget of a reasoning ``effort`` (``param``): its share (:data:`EFFORTS`) of the answer's token limit
        (the context's without one), at least 1; None for a model that does not think, or whose template takes the
        effort itself (gpt-oss, Hunyuan 3). 400 for an effort not in :data:`EFFORTS`."""
        if effort not in EFFORTS:
            raise ApiError(400, f"'{param}' must be one of {', '.join(EFFORTS)}, not {effort!r}", param=param)
        family, base = self.family, self._serving.context if max_tokens is None else max_tokens
        if family is None or family.think is None or family.efforts or base is None:
            return None
        return max(1, int(base * EFFORTS[effort]))

    def template_kwargs(self, given: dict[str, Any] | None, effort: str | None, param: str,
                        thinking: bool | None = None, budget: int | None = None) -> dict[str, Any]:
        """The variables the request gives the chat template: its ``chat_template_kwargs`` (``param``) over the
        server's, and its reasoning effort as ``reasoning_effort`` (gpt-oss's); ``thinking`` on or off (off for the
        effort ``"none"``) as the family's switch (:attr:`~llamafleet.engine.families.Family.switch`: Qwen's
        ``enable_thinking``, MiniMax M3's ``thinking_mode``); the reasoning ``budget`` as the family's own variable
        for it (:attr:`~llamafleet.engine.families.Family.budget`: Seed-OSS's ``thinking_budget``); unless the
        kwargs set those themselves."""
        if reserved := [k for k in given or {} if k in RESERVED_KWARGS]:
            raise ApiError(400, f"'{param}' may not set {reserved[0]!r}: the server sets it", param=param)
        kwargs = {**dict(self._serving.template_kwargs), **(given or {})}
        if effort is not None:  # (as the template's own level, where it has its own)
            kwargs.setdefault("reasoning_effort", dict(self.family.efforts if self.family else ()).get(effort, effort))
        if thinking is None and effort == "none":
            thinking = False
        if thinking is not None:
            name, on, off = (self.family or FAMILIES["think"]).switch
            kwargs.setdefault(name, on if thinking else off)
        if budget is not None and self.family is not None and self.family.budget:
            kwargs.setdefault(self.family.budget, budget)
        return kwargs
