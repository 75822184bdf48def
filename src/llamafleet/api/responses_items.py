"""The Responses API's input items (``POST /v1/responses``'s ``input``): messages, function calls and their outputs,
reasoning; each as a chat message (:func:`chat_messages`) and in the canonical shape a stored response keeps it
(``stored``). Items of the hosted tools' kinds are refused by their type.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Tag, TypeAdapter

from llamafleet.api.chat_messages import ChatMessage
from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import Block, check_unicode
from llamafleet.api.protocol import Request as Body
from llamafleet.api.tools import CalledFunction, ToolCall

TEXT_PARTS = ("input_text", "output_text", "text")
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
