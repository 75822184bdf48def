"""One sequence relayed to an upstream OpenAI-compatible server: who the upstream is, the request a sequence becomes,
its stream read back.

Pure translation, no I/O: :class:`RemoteMember` is one upstream as its worker needs it; :func:`upstream_request`
turns a :class:`~llamafleet.fleet.messages.Submit` into the path and JSON body of a streamed ``/v1/chat/completions``
(chat turns) or ``/v1/completions`` (a text or token-id prompt) with ``n`` = 1 (the dispatcher already made one
sequence per choice) and usage asked for; :class:`StreamReader` turns the SSE lines that come back (read by
:func:`llamafleet.openai_wire.parse_sse_line`) into the engine's :class:`~llamafleet.engine.types.RequestOutput` s,
the same ones a local replica sends; :func:`upstream_failure` words an upstream's error answer with the status the
front's client gets.

The front has no vocabulary of an upstream's model, so a relayed stream has its own: the tokens of its outputs are
the pieces of text the upstream sent, each under an id made up for this stream (one per distinct piece; see
:class:`StreamReader`). Without logprobs each content chunk is one token, for the front's timings (time to first
token, gaps); with logprobs, the tokens are those the upstream scores. The token counts of usage are the upstream's
own (``stream_options.include_usage``; an upstream that sends none is counted one token per chunk or scored token,
and no prompt tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamafleet.engine.types import LLAMA_CPP_KNOBS, OPENAI_KNOBS, FinishReason, RequestOutput
from llamafleet.fleet.messages import Submit
from llamafleet.openai_wire import StreamEvent, error_text, parse_sse_line


@dataclass(frozen=True, kw_only=True)
class RemoteMember:
    """One upstream server, as its worker needs it. ``api_key`` is kept out of ``repr`` (and so out of logs)."""

    url: str  # the server's root, without /v1: "http://10.0.0.2:8080"
    model: str | None  # the upstream's name of the model; None: the first one its /v1/models lists
    max_concurrency: int = 8  # sequences it is given at once: its slots in the router
    timeout_s: float = 60.0  # the longest wait for the upstream's next byte (connect, first token, between chunks)
    llama_cpp: bool = True  # it takes llama.cpp's extra fields (LLAMA_CPP_KNOBS, grammar, ignore_eos)
    api_key: str | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"remote {self.url}"


# Sampling knobs go upstream when they differ from the defaults (an upstream at its defaults samples as ours do, and
# an older one need not know a knob added since), except these, whose defaults differ between servers
ALWAYS_SENT = ("temperature", "top_p")  # llama-server's are 0.8 and 0.95


def upstream_request(msg: Submit, member: RemoteMember, model: str) -> tuple[str, dict[str, Any]]:
    """The path and JSON body that ask ``member`` (whose name of the model is ``model``) for ``msg``'s sequence."""
    p = msg.params
    knobs = {*ALWAYS_SENT, *p.changed(OPENAI_KNOBS + (LLAMA_CPP_KNOBS if member.llama_cpp else ()))}
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            **{k: getattr(p, k) for k in (*OPENAI_KNOBS, *LLAMA_CPP_KNOBS) if k in knobs}}
    if p.max_tokens is not None:
        body["max_tokens"] = p.max_tokens
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in p.logit_bias}
    if member.llama_cpp and p.changed(("penalty_last_n",)):
        body["repeat_last_n"] = p.penalty_last_n  # llama.cpp servers' name for it
    if p.logprobs and msg.chat is not None:
        body |= {"logprobs": True, "top_logprobs": p.top_logprobs}
    elif p.logprobs:
        body["logprobs"] = p.top_logprobs  # the legacy form: how many alternatives (0: the chosen token's only)
    if member.llama_cpp and p.grammar is not None:
        body["grammar"] = p.grammar
    if member.llama_cpp and p.ignore_eos:
        body["ignore_eos"] = True
    if p.think_budget is not None:  # (a chat's, to a llama.cpp-family member: see remote.unrelayable)
        body["reasoning_budget"] = p.think_budget
    if msg.chat is not None:
        body["messages"] = [{"role": role, "content": content} for role, content in msg.chat]
        return "/v1/chat/completions", body
    body["prompt"] = list(msg.prompt_ids) if msg.prompt_ids is not None else msg.prompt
    return "/v1/completions", body


def upstream_failure(status: int, body: bytes, label: str) -> tuple[int, str]:
    """The status and message the front's client gets for an upstream's error answer.

    4xx other than 401/403 is the request's own fault: the client gets the same status and the upstream's words.
    401/403 is the member's configuration (its key), not the client's: 502. 5xx: 502, or 503 for the upstream's 503
    (busy or loading: worth a retry), 504 for its 504."""
    text = error_text(body)
    if status in (401, 403):
        return 502, (f"{label} refused this server's credentials ({status}: {text}); the operator must fix the "
                     "member's api_key_env / api_key_file")
    if 400 <= status < 500:
        return status, f"{label} refused the request ({status}): {text}"
    return (status if status in (503, 504) else 502), f"{label} failed ({status}): {text}"


class UpstreamError(Exception):
    """The upstream ended a stream with an error event, or sent what is not an OpenAI stream."""


class StreamReader:
    """Turns one upstream SSE stream into :class:`RequestOutput` s for ``request_id`` (see the module docstring).

    The ids of the tokens are this stream's own: one per distinct piece of text (:attr:`ids`). The front needs them
    only to count and time tokens and, with ``logprobs``, to look up the bytes of each token and of its
    alternatives, which then travel with the output as a local replica's do."""

    def __init__(self, request_id: str, logprobs: bool = False) -> None:
        self.request_id = request_id
        self.logprobs = logprobs
        self.ids: dict[bytes, int] = {}
        self.tokens = 0
        self.finish: FinishReason | None = None
        self.usage: StreamEvent | None = None  # the last line that carried token counts
        self.done = False  # data: [DONE] seen

    def line(self, line: str) -> tuple[RequestOutput, list[bytes]] | None:
        """The output one SSE line adds, if any, with the bytes of each of its tokens when logprobs were asked for
        (:class:`UpstreamError` for an error event, or a line that is not an OpenAI stream's)."""
        ev = parse_sse_line(line)
        if ev is None:
            return None
        if ev.error is not None:
            raise UpstreamError(ev.error)
        self.done = self.done or ev.done
        if ev.usage:
            self.usage = ev
        if ev.finish_reason:
            self.finish = "length" if ev.finish_reason == "length" else "stop"
        if not self.logprobs:
            if not ev.text:
                return None
            self.tokens += 1
            return RequestOutput(self.request_id, text=ev.text, token_ids=[self._id(ev.text.encode())],
                                 completion_tokens=self.tokens), []
        scored = [s for lp in ev.logprobs for s in _scored(lp)]
        if not (ev.text or scored):
            return None
        self.tokens += len(scored)
        ids = [self._id(b) for b, _, _ in scored]
        top = [[(self._id(b), lp) for b, lp in alts] for _, _, alts in scored]
        words = {i: b for b, i in self.ids.items() if i in {*ids, *(t for alts in top for t, _ in alts)}}
        return RequestOutput(self.request_id, text=ev.text, token_ids=ids, logprobs=[lp for _, lp, _ in scored],
                             completion_tokens=self.tokens,
                             top_logprobs=top if any(top) else None, token_bytes=words), [b for b, _, _ in scored]

    def _id(self, word: bytes) -> int:
        return self.ids.setdefault(word, len(self.ids))

    def last(self) -> RequestOutput:
        """The final output, once the stream has ended with a finish reason, counted from the upstream's usage."""
        assert self.finish is not None
        usage = self.usage or StreamEvent()
        return RequestOutput(self.request_id, logprobs=[] if self.logprobs else None, finished=True,
                             finish_reason=self.finish, prompt_tokens=usage.prompt_tokens or 0,
                             completion_tokens=usage.completion_tokens or self.tokens,
                             cached_tokens=usage.cached_tokens or 0)


def _word(entry: dict[str, Any]) -> bytes:
    """A chat logprobs entry's token as bytes (exact when the upstream sends ``bytes``)."""
    raw = entry.get("bytes")
    return bytes(raw) if isinstance(raw, list) else str(entry.get("token", "")).encode()


def _scored(lp: Any) -> list[tuple[bytes, float, list[tuple[bytes, float]]]]:
    """(token, logprob, alternatives) of each token in a choice's ``logprobs``: chat's ``content`` list, or the
    completions' parallel ``tokens`` / ``token_logprobs`` / ``top_logprobs`` lists."""
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):
        return [(_word(e), float(e["logprob"]), [(_word(t), float(t["logprob"])) for t in e.get("top_logprobs") or []])
                for e in lp["content"]]
    tops = lp.get("top_logprobs") or []
    return [(str(t).encode(), float(p), [(str(a).encode(), float(b)) for a, b in (tops[i] or {}).items()]
             if i < len(tops) else [])
            for i, (t, p) in enumerate(zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], strict=False))]
