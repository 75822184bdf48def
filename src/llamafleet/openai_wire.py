"""The OpenAI wire format as a client reads it: a server's root URL, its error bodies, and its streamed answers.

Two parts of llamafleet are clients of OpenAI-compatible servers: a remote member relays sequences to its upstream
(:mod:`llamafleet.fleet.relay`), and the benchmark times a server's answers (:mod:`llamafleet.bench.streaming`).
Both read the server-sent events of ``/v1/completions`` (``choices[].text``) and ``/v1/chat/completions``
(``choices[].delta.content``) with :func:`parse_sse_line`, one ``data:`` line at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def root_url(url: str) -> str:
    """``url`` without a trailing slash or ``/v1``: ``http://host:port``, ``.../`` and ``.../v1`` name one server."""
    return url.rstrip("/").removesuffix("/v1")


def bearer(api_key: str | None) -> dict[str, str]:
    """The headers that present ``api_key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def error_text(body: bytes) -> str:
    """The message of an OpenAI-shaped error body (``{"error": {"message": ...}}``), else the body's start."""
    try:
        data = json.loads(body)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data.get("error") or data
        return str(message)[:500]
    except (ValueError, TypeError, KeyError, AttributeError):
        return body[:300].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class StreamEvent:
    """What one ``data:`` line said: new text (every choice's, in order), a finish reason, the usage counts where the
    server sends them (``stream_options.include_usage``), each choice's ``logprobs`` object as sent, or an error."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server sends it
    logprobs: tuple[Any, ...] = ()  # one per choice that carried a logprobs object
    error: str | None = None
    done: bool = False  # data: [DONE]

    @property
    def usage(self) -> bool:
        """Whether this line carried token counts."""
        return self.completion_tokens is not None or self.prompt_tokens is not None


def parse_sse_line(line: str) -> StreamEvent | None:
    """Parse one line of an OpenAI streaming response; ``None`` for lines that carry no data (blank separators,
    comments, ``event:`` names). A line that is not a JSON object, or that carries an ``error``, gives an event whose
    ``error`` says so."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return StreamEvent(done=True)
    try:
        obj = json.loads(data)
    except ValueError:
        return StreamEvent(error=f"malformed stream data (not JSON): {data[:200]!r}")
    if not isinstance(obj, dict):
        return StreamEvent(error=f"unexpected stream data (not an object): {data[:200]!r}")
    if obj.get("error") is not None:
        return StreamEvent(error=error_text(data.encode()))
    text, finish, logprobs = "", None, []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text += (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        finish = choice.get("finish_reason") or finish
        if choice.get("logprobs") is not None:
            logprobs.append(choice["logprobs"])
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return StreamEvent(text=text, finish_reason=finish, logprobs=tuple(logprobs))
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return StreamEvent(text=text, finish_reason=finish, completion_tokens=_count(usage.get("completion_tokens")),
                       prompt_tokens=_count(usage.get("prompt_tokens")), cached_tokens=_count(cached),
                       logprobs=tuple(logprobs))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) else None
