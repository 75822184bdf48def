"""The model's own Jinja chat template, for conversations with tools and for the models of a known family
(:mod:`~llamafleet.engine.families`): rendered as Hugging Face's ``transformers`` renders it, so a model trained to
read tools and its own thinking its own way (Qwen 2.5/3, Llama 3.1+, Hermes, Mistral, DeepSeek, ...) reads them that
way, with the client's ``chat_template_kwargs`` (``enable_thinking``, ``reasoning_effort``, ...) as variables.

llama.cpp's built-in template matcher (``llama_chat_apply_template``, used for every other chat) recognises a
template family by its markup and knows nothing of tools, calls or tool results. A GGUF carries its template's Jinja
source (``tokenizer.chat_template``, or a separate ``tokenizer.chat_template.tool_use``); when that source uses the
``tools`` variable, it is taken to show tools (:func:`shows_tools`: read from the parsed template, not searched as
text) and a conversation with tools is rendered with it here; so is every conversation of a model whose family is
recognised. Otherwise the caller keeps the generic rendering (the tools listed in the system prompt). The template is
tried once at load on a small conversation (:func:`tool_template`): one that fails there is not used at all, with one
warning, and so is one that shows tools in markup no family here reads (then with a warning that calls are read in
the generic formats only).

What HF templates expect is provided: ``messages`` (assistant ``tool_calls`` as ``{"id", "type": "function",
"function": {"name", "arguments": {...}}}`` with the arguments as an object, ``role: "tool"`` messages with
``tool_call_id`` and ``name``), ``tools`` (``[{"type": "function", "function": {...}}]``, or none),
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``, ``strftime_now``, ``tojson`` with HF's
arguments (``ensure_ascii`` off, ``indent``, ``separators``, ``sort_keys``), ``trim_blocks`` / ``lstrip_blocks`` and
the loop-control extension and HF's ``{% generation %}`` tag. The environment is Jinja's sandbox: a template comes
with a model file and client text flows through it, so neither may reach Python internals; it gets copies of the
conversation, which it may change (templates build lists with ``append``) without changing the caller's. A template that
fails on a conversation (``raise_exception``, a sandbox refusal, an undefined value) is a ``ValueError`` naming the
template, which the worker answers with a 400.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

from llamafleet.engine.families import Family, detect

log = logging.getLogger(__name__)
PROBE = ({"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"})
PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "A probe.",
                                               "parameters": {"type": "object", "properties": {}}}}
PROBE_HISTORY = (*PROBE, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "probe", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "probe", "content": "ok"})


@dataclass(frozen=True)
class ToolChat:
    """A conversation with tools, in the shape HF templates read: ``messages`` (assistant ``tool_calls``,
    ``role: "tool"`` results) and the callable ``tools`` (none under ``tool_choice: "none"``). Sent beside the
    generic rendering's turns; used when the model's template shows tools."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()  # the client's chat_template_kwargs: more variables for the template


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


class _Generation(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` (it marks the assistant's tokens for training): its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def _variables(source: str) -> set[str]:
    """The variables a template's Jinja source reads (none when it cannot be parsed)."""
    try:
        return set(meta.find_undeclared_variables(_environment().parse(source)))
    except jinja2.TemplateError:
        return set()


def shows_tools(source: str) -> bool:
    """Whether a template's Jinja source reads the ``tools`` variable (a template that cannot be parsed: no)."""
    return "tools" in _variables(source)


class ChatTemplate:
    """One model's Jinja chat template, compiled once."""

    def __init__(self, source: str, bos_token: str, eos_token: str, strip_bos: bool,
                 family: Family | None = None) -> None:
        self.template = _environment().from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.strip_bos = strip_bos  # the tokenizer adds BOS itself: a BOS the template writes would be a second one
        self.family = family
        self.plain = True  # it renders chats without tools too (some tool_use templates need tools)
        self.shows_tools = shows_tools(source)  # it lists the tools (else the generic prompt must)
        # earlier calls' arguments as JSON text, for a template that fails on HF's object (Functionary v3.2)
        self.text_arguments = False
        # variables some templates read besides HF's: the tools as JSON text, the date (FireFunction v2)
        self.extras = _variables(source) & {"functions", "datetime"}

    def renders(self, with_tools: bool) -> bool:
        """Whether conversations with tools (``with_tools``) or without are rendered by this template."""
        return self.shows_tools if with_tools else self.plain

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = (),
               kwargs: Sequence[tuple[str, Any]] = ()) -> str:
        """The prompt text of ``messages`` with ``tools`` and the variables ``kwargs``, the assistant's turn opened."""
        extras = {"functions": json.dumps(list(tools), ensure_ascii=False, indent=2) if tools else "",
                  "datetime": datetime.now().strftime("%b %d %Y %H:%M:%S")}
        try:
            text = self.template.render({**{k: v for k, v in extras.items() if k in self.extras},
                                         **copy.deepcopy(dict(kwargs))}, messages=self._given(messages),
                                        tools=copy.deepcopy(list(tools)) or None,
                                        add_generation_prompt=True, bos_token=self.bos_token,
                                        eos_token=self.eos_token)
        except Exception as e:  # the template's own code failed on this conversation (a sandbox refusal, a type)
            failed = e if isinstance(e, TemplateFailed) else TemplateFailed(
                f"the model's chat template could not render this conversation: {type(e).__name__}: {e}")
            raise self._blame(failed, messages, tools, kwargs) from None
        return text.removeprefix(self.bos_token) if self.strip_bos and self.bos_token else text

    def _given(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Copies of ``messages`` as this template takes them (earlier calls' arguments as text or not)."""
        given = copy.deepcopy(list(messages))
        for m in given:
            for call in m.get("tool_calls") or () if self.text_arguments else ():
                args = call.get("function", {}).get("arguments")
                if not isinstance(args, str):
                    call["function"]["arguments"] = json.dumps(args, ensure_ascii=False)
        return given

    def _blame(self, failed: TemplateFailed, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
               kwargs: Sequence[tuple[str, Any]]) -> TemplateFailed:
        """``failed`` naming the one of ``kwargs`` whose value the template refused, when leaving it out helps."""
        for key, _ in kwargs:
            try:
                self.render(messages, tools, [kv for kv in kwargs if kv[0] != key])
            except TemplateFailed:
                continue
            return TemplateFailed(f"chat_template_kwargs.{key}: the model's chat template refused this value "
                                  f"({failed})")
        return failed


def tool_template(source: str | None, bos_token: str, eos_token: str, add_bos: bool) -> ChatTemplate | None:
    """The model's template compiled for conversations with tools and for its family's, None when it shows no tools
    and is of no known family (or there is none), or when it fails on a small conversation (a warning says so)."""
    family = detect(source)
    if source is None or not (shows_tools(source) or family is not None):
        return None
    try:
        template = ChatTemplate(source, bos_token, eos_token, strip_bos=add_bos, family=family)
        template.render(PROBE, [PROBE_TOOL])
        try:
            template.render(PROBE)
        except TemplateFailed:
            template.plain = False
        _conventions(template)
    except (TemplateFailed, jinja2.TemplateError) as e:
        log.warning("the model's chat template cannot be used (%s); chats use llama.cpp's built-in template, tools "
                    "the generic prompt, and no reasoning is split out", e)
        return None
    if family is None:
        log.warning("the model's chat template shows tools in a markup no known family uses; tool calls are read "
                    "in the generic formats (<tool_call> blocks, JSON) and no reasoning is split out")
    return template


def _conventions(template: ChatTemplate) -> None:
    """Find how ``template`` takes earlier calls: their arguments as an object (HF's way), else as JSON text; one
    that takes them neither way is still used for everything else, with a warning: a conversation holding calls is
    then a 400 naming the template."""
    failed: TemplateFailed | None = None
    for template.text_arguments in (False, True):
        try:
            template.render(PROBE_HISTORY, [PROBE_TOOL])
            return
        except TemplateFailed as e:
            failed = failed or e
    template.text_arguments = False
    log.warning("the model's chat template cannot render earlier tool calls and their results (%s); conversations "
                "that hold them are refused", failed)
