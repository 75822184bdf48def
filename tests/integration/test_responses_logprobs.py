"""Logprobs on ``/v1/responses`` through a real ``llamafleet serve`` with the OpenAI SDK: ``include:
["message.output_text.logprobs"]`` and ``top_logprobs`` put each token's logprob and its top alternatives on the
``output_text`` part, the same numbers chat reports for the same conversation; a stream carries them on its text
deltas, and they add up to the whole answer's."""

from __future__ import annotations

from typing import Any

import pytest
from openai import OpenAI

pytestmark = pytest.mark.each_engine

# over 256 characters, so that prefix routing sends each request to the replica that holds it (see warm)
ASK = ("You are helping someone paint a small room that gets little light in the afternoon. The walls are plain, the "
       "floor is dark wood and the furniture is mostly white. They want something calm but not cold, and they will "
       "paint it themselves over a weekend. Name a colour.")
INCLUDE: Any = ["message.output_text.logprobs"]


def _logprobs(response: Any) -> list[Any]:
    (message,) = response.output
    (part,) = message.content
    return list(part.logprobs or [])


def warm(client: OpenAI, model: str) -> None:
    """Put the prompt in a replica's prefix cache: the requests compared then all read it there and compute the same
    last token (logprobs of a prompt computed whole and of one read from the cache differ in the second decimal on
    the quantised demo model, and which one a request gets depended on the tests before)."""
    client.responses.create(model=model, input=ASK, max_output_tokens=1, temperature=0)


def test_top_logprobs_are_chats(client: OpenAI, model: str) -> None:
    warm(client, model)
    r = client.responses.create(model=model, input=ASK, max_output_tokens=5, temperature=0, include=INCLUDE,
                                top_logprobs=3)
    lps = _logprobs(r)
    assert r.usage is not None and len(lps) == r.usage.output_tokens == 5 and r.top_logprobs == 3
    assert b"".join(bytes(t.bytes) for t in lps).decode("utf-8", "replace") == r.output_text
    for tok in lps:
        values = [t.logprob for t in tok.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert tok.top_logprobs[0].bytes == tok.bytes  # greedy: the best one was chosen
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": ASK}], max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in lps] == \
        [(t.token, pytest.approx(t.logprob), [a.token for a in t.top_logprobs]) for t in content]


def test_streamed_logprobs_ride_on_the_text_deltas(client: OpenAI, model: str) -> None:
    args: dict[str, Any] = dict(model=model, input=ASK, max_output_tokens=8, temperature=0, include=INCLUDE,
                                top_logprobs=2)
    warm(client, model)
    whole = _logprobs(client.responses.create(**args))
    events = list(client.responses.create(**args, stream=True))
    carried = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    final: Any = events[-1]
    for streamed in (carried, done.logprobs, _logprobs(final.response)):
        assert [(t.token, pytest.approx(t.logprob)) for t in streamed] == [(t.token, t.logprob) for t in whole]
        assert all(len(t.top_logprobs or []) == 2 for t in streamed)


def test_logprobs_only_when_asked(client: OpenAI, model: str) -> None:
    plain = client.responses.create(model=model, input=ASK, max_output_tokens=3, temperature=0)
    assert _logprobs(plain) == []
    chosen = _logprobs(client.responses.create(model=model, input=ASK, max_output_tokens=3, temperature=0,
                                               include=INCLUDE))
    assert len(chosen) == 3 and all(t.top_logprobs == [] and t.logprob <= 0 for t in chosen)
