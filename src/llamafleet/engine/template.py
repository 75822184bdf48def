"""The model's own Jinja chat template, for conversations with tools: rendered as Hugging Face's ``transformers``
renders it, so a model trained to read tools its own way (Qwen 2.5/3, Llama 3.1+, Hermes, Mistral, ...) reads them
that way.

llama.cpp's built-in template matcher (``llama_chat_apply_template``, used for every other chat) recognises a
template family by its markup and knows nothing of tools, calls or tool results. A GGUF carries its template's Jinja
source (``tokenizer.chat_template``, or a separate ``tokenizer.chat_template.tool_use``); when that source uses the
``tools`` variable, it is taken to show tools (:func:`shows_tools`: read from the parsed template, not searched as
text) and a conversation with tools is rendered with it here. Otherwise the caller keeps the generic rendering (the
tools listed in the system prompt).

What HF templates expect is provided: ``messages`` (assistant ``tool_calls`` as ``{"id", "type": "function",
"function": {"name", "arguments": {...}}}`` with the arguments as an object, ``role: "tool"`` messages with
``tool_call_id`` and ``name``), ``tools`` (``[{"type": "function", "function": {...}}]``, or none),
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``, ``strftime_now``, ``tojson`` with HF's
arguments (``ensure_ascii`` off, ``indent``, ``separators``, ``sort_keys``), ``trim_blocks`` / ``lstrip_blocks`` and
the loop-control extension. The environment is Jinja's immutable sandbox: a template comes with a model file and
client text flows through it, so neither may reach Python internals or change the objects passed in. A template that
fails on a conversation (``raise_exception``, a sandbox refusal, an undefined value) is a ``ValueError`` naming the
template, which the worker answers with a 400.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


@dataclass(frozen=True)
class ToolChat:
    """A conversation with tools, in the shape HF templates read: ``messages`` (assistant ``tool_calls``,
    ``role: "tool"`` results) and the callable ``tools`` (none under ``tool_choice: "none"``). Sent beside the
    generic rendering's turns; used when the model's template shows tools."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()


class TemplateFailed(ValueError):
    """The template refused or failed to render a conversation."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's ``tojson``: unlike Jinja's own, it neither escapes HTML characters nor forces ASCII."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TemplateFailed(f"the model's chat template refused this conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def shows_tools(source: str) -> bool:
    """Whether a template's Jinja source reads the ``tools`` variable (a template that cannot be parsed: no)."""
    try:
        return "tools" in meta.find_undeclared_variables(_environment().parse(source))
    except jinja2.TemplateError:
        return False


class ChatTemplate:
    """One model's Jinja chat template, compiled once."""

    def __init__(self, source: str, bos_token: str, eos_token: str, strip_bos: bool) -> None:
        self.template = _environment().from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.strip_bos = strip_bos  # the tokenizer adds BOS itself: a BOS the template writes would be a second one

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> str:
        """The prompt text of ``messages`` with ``tools``, the assistant's turn opened."""
        try:
            text = self.template.render(messages=list(messages), tools=list(tools) or None, add_generation_prompt=True,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateFailed:
            raise
        except Exception as e:  # the template's own code failed on this conversation (a sandbox refusal, a type)
            raise TemplateFailed(f"the model's chat template could not render this conversation: "
                                 f"{type(e).__name__}: {e}") from None
        return text.removeprefix(self.bos_token) if self.strip_bos and self.bos_token else text


def tool_template(source: str | None, bos_token: str, eos_token: str, add_bos: bool) -> ChatTemplate | None:
    """The model's template compiled for conversations with tools, None when it shows no tools (or there is none)."""
    if source is None or not shows_tools(source):
        return None
    return ChatTemplate(source, bos_token, eos_token, strip_bos=add_bos)
