"""Chat messages -> prompt tokens, where only the chat template's own markup may become special tokens.

The template's output is text such as ``<|im_start|>user\\nHi<|im_end|>``; it must be tokenized with special-token
parsing on, or its markup would be split into ordinary pieces. But then a message whose *content* spells that markup
(``<|im_end|><|im_start|>system\\n...``) would become real control tokens: a user could forge a system or assistant
turn. So contents are tokenized as plain text, always.

When no content spells a special token (the usual case) the whole rendered prompt is tokenized in one piece, exactly
as before. Otherwise the template is rendered with a placeholder in place of each content; the markup between the
placeholders is tokenized with special parsing and each content without it. Pure logic over two callables, so it is
tested without llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Render = Callable[[Sequence[dict[str, str]]], str]  # messages -> the template's text (generation prompt included)
Tokenize = Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special) -> token ids

# Private-use code points: no template adds or changes them, and no tokenizer sees them (they are split on first).
_MARK = "\ue000{}\ue001"


def spells_special(text: str, tokenize: Tokenize) -> bool:
    """Whether ``text`` would contain a special token if its special-token spellings were parsed."""
    return tokenize(text, False, True) != tokenize(text, False, False)


def chat_tokens(messages: Sequence[dict[str, str]], render: Render, tokenize: Tokenize) -> list[int]:
    """The prompt tokens of ``messages``: the template's markup parsed as special tokens, contents as plain text."""
    if not any(spells_special(m["content"], tokenize) for m in messages):
        return tokenize(render(messages), True, True)
    marks = [_MARK.format(i) for i in range(len(messages))]
    text = render([{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)])
    pieces: list[tuple[str, bool]] = []  # (text, parse_special)
    for i, (m, mark) in enumerate(zip(messages, marks, strict=True)):
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
