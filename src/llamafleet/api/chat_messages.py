"""Chat messages as OpenAI's chat completions send them, and as every chat dialect renders them: (role, content)
turns for the model's template, tools listed in the system prompt (:mod:`~llamafleet.api.tools`), or the whole
conversation for a template that shows tools itself (:class:`~llamafleet.engine.template.ToolChat`). Anthropic's and
the Responses API's requests are translated into these messages."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from llamafleet.api.protocol import Request, TextPart, check_unicode
from llamafleet.api.tools import Tool, ToolCall, assistant_text, tool_result_text, with_tools
from llamafleet.engine.families import Family
from llamafleet.engine.template import ToolChat


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # null only in an assistant's turn that made tool calls
    name: str | None = None
    tool_calls: list[ToolCall] = []  # an assistant's earlier calls
    tool_call_id: str | None = None  # which call a tool's result answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (either name), for templates that show it
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[TextPart] | None) -> str | list[TextPart] | None:
        if isinstance(v, str):
            check_unicode([v])
        return v

    @model_validator(mode="after")
    def _complete(self) -> ChatMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("'content' is required (it may be null only in an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry 'tool_calls'")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the 'tool_call_id' of the call it answers")
        return self

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)

    def template_message(self, call_names: dict[str, str]) -> dict[str, Any]:
        """The message as chat templates read it (HF's shape): calls as ``tool_calls``, a tool result with the
        ``tool_call_id`` it answers and that call's function ``name`` (from ``call_names``) when known."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.template_call() for c in self.tool_calls]
        if thought := self.reasoning_content or self.reasoning:
            out["reasoning_content"] = thought  # the template keeps or drops it, as its model expects
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
            if self.tool_call_id in call_names:
                out["name"] = call_names[self.tool_call_id]
        return out

    def turn(self) -> tuple[str, str]:
        """(role, content) for the model's chat template; OpenAI's "developer" role is the older "system", and tool
        calls and results are written out as text (:mod:`~llamafleet.api.tools`)."""
        if self.role == "tool":
            return "user", tool_result_text(self.text())
        if self.tool_calls:
            return "assistant", assistant_text(self.text(), self.tool_calls)
        return ("system" if self.role == "developer" else self.role), self.text()


def chat_turns(messages: list[ChatMessage], tools: list[Tool]) -> tuple[tuple[str, str], ...]:
    """The (role, content) turns of ``messages`` for the model's chat template, ``tools`` listed in the system
    prompt (:func:`~llamafleet.api.tools.with_tools`)."""
    return with_tools([m.turn() for m in messages], tools)


def tool_chat(messages: list[ChatMessage], tools: list[Tool], family: Family | None = None,
              kwargs: dict[str, Any] | None = None) -> ToolChat | None:
    """The conversation for a model whose own template shows tools or is of a known ``family``, with the template
    variables ``kwargs``; None when the model has no family and the conversation holds no tools, calls, results or
    variables (it is then rendered as any chat)."""
    if family is None and not tools and not kwargs and not any(m.tool_calls or m.role == "tool" for m in messages):
        return None
    names = {c.id: c.function.name for m in messages for c in m.tool_calls}
    return ToolChat(tuple(m.template_message(names) for m in messages), tuple(t.spec() for t in tools),
                    tuple(sorted((kwargs or {}).items())))
