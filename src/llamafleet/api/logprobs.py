"""Logprobs the way OpenAI's clients read them: chat's ``logprobs.content`` (each token with its ``top_logprobs``) and
the text completions' ``logprobs`` object (parallel lists; with ``echo``, the prompt's own tokens first, the very
first with ``null``, which is what evaluation harnesses read to score a prompt's loglikelihood).

The replica sends token ids and the bytes of each id it names (the API process has no vocabulary); a token holding
only part of a UTF-8 character shows as U+FFFD in ``token`` (its ``bytes`` are exact).
"""

from __future__ import annotations

from typing import Any, Protocol

from llamafleet.api.protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob
from llamafleet.engine.types import PromptLogprobs, TopLogprobs


class Scored(Protocol):
    """A sequence's output so far (one step's, or the whole :class:`~llamafleet.engine.types.Generation`)."""

    @property
    def logprobs(self) -> list[float] | None: ...

    @property
    def top_logprobs(self) -> list[TopLogprobs] | None: ...

    @property
    def token_bytes(self) -> dict[int, bytes] | None: ...


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def _chat_top(top: TopLogprobs, words: dict[int, bytes]) -> list[dict[str, Any]]:
    return [{"token": token_text(words[t]), "logprob": lp, "bytes": list(words[t])} for t, lp in top]


def chat_logprobs(pieces: list[bytes], scored: Scored) -> ChoiceLogprobs | None:
    if scored.logprobs is None:
        return None
    tops, words = scored.top_logprobs or [], scored.token_bytes or {}
    return ChoiceLogprobs(content=[
        TokenLogprob(token=token_text(p), logprob=lp, bytes=list(p),
                     top_logprobs=_chat_top(tops[i], words) if i < len(tops) else [])
        for i, (p, lp) in enumerate(zip(pieces, scored.logprobs, strict=True))
    ])


def _text_top(top: TopLogprobs, words: dict[int, bytes]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t, lp in top:
        out.setdefault(token_text(words[t]), lp)  # two tokens of one text (e.g. U+FFFD): the likelier one
    return out


def prompt_text(scores: PromptLogprobs, words: dict[int, bytes]) -> str:
    """The text of a scored prompt (echo of a token-id prompt)."""
    return token_text(b"".join(words[t] for t in scores.token_ids))


def text_logprobs(pieces: list[bytes], scored: Scored, start: int = 0, prompt: PromptLogprobs | None = None
                  ) -> CompletionLogprobs | None:
    """The completions' logprobs of ``pieces`` (tokens whose text starts at ``start``), after the scored ``prompt``'s
    tokens when it is echoed. ``top_logprobs`` is null unless alternatives were asked for."""
    if scored.logprobs is None:
        return None
    words = scored.token_bytes or {}
    tokens: list[str] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if prompt is not None:
        tokens += [token_text(words[t]) for t in prompt.token_ids]
        lps += [None, *prompt.logprobs]
        tops += [None, *(_text_top(t, words) for t in prompt.top or [])]
    tokens += [token_text(p) for p in pieces]
    lps += scored.logprobs
    tops += [_text_top(t, words) for t in scored.top_logprobs or []]
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return CompletionLogprobs(tokens=tokens, token_logprobs=lps, top_logprobs=tops if len(tops) == len(tokens)
                              and any(t is not None for t in tops) else None, text_offset=offsets)
