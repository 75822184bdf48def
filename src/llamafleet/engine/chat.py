"""Chat messages -> prompt tokens, where only the chat template's own markup may become special tokens.

The template's output is text such as ``<|im_start|>user\\nHi<|im_end|>``; it must be tokenized with special-token
parsing on, or its markup would be split into ordinary pieces. But then a message whose *content* spells that markup
(``<|im_end|><|im_start|>system\\n...``) would become real control tokens: a user could forge a system or assistant
turn. So contents are tokenized as plain text, always.

When no content spells a special token (the usual case) the whole rendered prompt is tokenized in one piece, exactly
as before. Otherwise the template is rendered with a placeholder in place of each such content; the markup between
the placeholders is tokenized with special parsing and each content without it. Pure logic over two callables, so it
is tested without llama.cpp.

A conversation with tools rendered by the model's own Jinja template (:mod:`~llamafleet.engine.template`) shows
client text outside the message contents too: the tools' names, descriptions and schemas, earlier calls' arguments.
A placeholder cannot stand in for those (a template may reformat them, ``tojson`` them, or loop over them), so when
any of it spells a special token the conversation is not rendered that way at all (:func:`tool_chat_tokens` answers
None) and keeps the generic rendering, where all of it is message content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from llamafleet.engine.template import ChatTemplate, ToolChat

Render = Callable[[Sequence[dict[str, Any]]], str]  # messages -> the template's text (generation prompt included)
Tokenize = Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special) -> token ids

# Private-use code points: no template adds or changes them, and no tokenizer sees them (they are split on first).
_MARK = "\ue000{}\ue001"


def spells_special(text: str, tokenize: Tokenize) -> bool:
    """Whether ``text`` would contain a special token if its special-token spellings were parsed."""
    return tokenize(text, False, True) != tokenize(text, False, False)


def chat_tokens(messages: Sequence[dict[str, Any]], render: Render, tokenize: Tokenize) -> list[int]:
    """The prompt tokens of ``messages``: the template's markup parsed as special tokens, contents as plain text."""
    spelling = [i for i, m in enumerate(messages) if spells_special(m["content"], tokenize)]
    if not spelling:
        return tokenize(render(messages), True, True)
    marks = {i: _MARK.format(i) for i in spelling}
    text = render([{**m, "content": marks[i]} if i in marks else m for i, m in enumerate(messages)])
    pieces: list[tuple[str, bool]] = []  # (text, parse_special)
    for i, mark in marks.items():
        m = messages[i]
        markup, found, text = text.partition(mark)
        if not found:
            raise ValueError("a chat message spells the model's special tokens, and this model's chat template does "
                             f"not show message {i} as it was given, so it cannot be kept as plain text; remove the "
                             "special-token text or send the prompt to /v1/completions")
        pieces += [(markup, True), (m["content"], False)]
    pieces.append((text, True))
    ids: list[int] = []
    for piece, special in pieces:
        if piece:
            ids += tokenize(piece, not ids, special)  # BOS (when the model wants one) before the first piece only
    return ids


def tool_chat_tokens(chat: ToolChat, template: ChatTemplate, tokenize: Tokenize) -> list[int] | None:
    """The prompt tokens of ``chat`` through the model's own template, contents kept plain as in :func:`chat_tokens`;
    None when client text the template shows outside the contents (tools, calls) spells a special token."""
    outside = [{k: v for k, v in m.items() if k != "content"} for m in chat.messages]
    if spells_special(json.dumps([chat.tools, outside], ensure_ascii=False), tokenize):
        return None
    return chat_tokens(chat.messages, partial(template.render, tools=chat.tools, kwargs=chat.kwargs), tokenize)
