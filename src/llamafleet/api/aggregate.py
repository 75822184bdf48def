"""Result aggregation: turning a group's per-step events into one response, whole or streamed (SSE).

A group's sequences (``n`` choices x prompts) finish in any order on any replica; each event carries its index, so
choices are assembled in input order. The shape of the JSON (chat or text completion, Anthropic message, Responses
object) and how a stream is framed and ended (``data: [DONE]``, named events) is a :class:`Renderer`'s job; this
module owns the control flow every route shares: waiting (and noticing a client that went away), failing the whole
request when a sequence fails, usage counts, and aborting what is left when the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from llamafleet.api.errors import ApiError, internal_error
from llamafleet.api.protocol import CompletionTokensDetails, PromptTokensDetails, Usage
from llamafleet.api.recent import note_error, note_usage
from llamafleet.engine.types import ContextOverflow, Generation
from llamafleet.fleet.dispatch import Delta, Event, Failure, Group

REPLICAS_HEADER = "x-llamafleet-replicas"  # which replica ran each choice, in order (for operators and tests)
DISCONNECT_POLL_S = 1.0  # how often a non-streaming request checks that its client is still there


@dataclass
class Choice:
    """One sequence's result so far: the engine's completion plus, with logprobs, each token's text."""

    generation: Generation
    pieces: list[bytes] = field(default_factory=list)
    first_token_at: float | None = None  # time.perf_counter() when its first token arrived

    def add(self, delta: Delta) -> None:
        if self.first_token_at is None and delta.output.token_ids:
            self.first_token_at = time.perf_counter()
        self.generation.add(delta.output)
        if delta.pieces:
            self.pieces.extend(delta.pieces)


def new_choices(group: Group) -> list[Choice]:
    return [Choice(Generation(rid)) for rid in group.request_ids]


def usage(choices: Sequence[Generation], n: int) -> Usage:
    """Token counts of a request whose choices are ``n`` per prompt (a prompt is counted once, not n times, and so
    are its tokens served from the prefix cache); also noted on the request's line in the recent-requests list."""
    prompt = sum(c.prompt_tokens for c in choices[::n])
    completion = sum(c.completion_tokens for c in choices)
    cached = PromptTokensDetails(cached_tokens=sum(c.cached_tokens for c in choices[::n]))
    note_usage(prompt, completion, cached.cached_tokens, [c.cache for c in choices[::n] if c.cache is not None])
    accepted = sum(c.accepted_tokens for c in choices)
    drafts = CompletionTokensDetails(accepted_prediction_tokens=accepted,
                                     rejected_prediction_tokens=sum(c.drafted_tokens for c in choices) - accepted)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=cached, completion_tokens_details=drafts)


class Renderer(Protocol):
    """The JSON of one endpoint, and the framing of its streams."""

    def opening(self, n_choices: int) -> Sequence[BaseModel]:
        """Chunks streamed before any output (e.g. the chat's assistant role)."""
        ...

    def chunk(self, index: int, delta: Delta) -> Sequence[BaseModel]:
        """The streamed chunks for ``delta``; none when it adds nothing visible."""
        ...

    def closing(self, usage: Usage) -> Sequence[BaseModel]:
        """Chunks streamed after every sequence finished (e.g. the usage chunk)."""
        ...

    def whole(self, choices: list[Choice], usage: Usage) -> BaseModel: ...

    def event(self, chunk: BaseModel) -> str:
        """One chunk as a server-sent event."""
        ...

    def failed(self, error: ApiError) -> str:
        """The events that end a stream with ``error``."""
        ...

    def end(self) -> str:
        """What ends every stream that did not fail (e.g. ``data: [DONE]``)."""
        ...

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        """The 400 for a prompt too long for the context, in the words this endpoint's clients recognise."""
        ...


async def _watch(group: Group, request: Request) -> None:
    """Poll for the client going away while it waits (a stream's own disconnects are noticed by Starlette)."""
    while True:
        await asyncio.sleep(DISCONNECT_POLL_S)
        if await request.is_disconnected():
            group.close()  # abort on the replicas
            group.put(0, Failure(499, "the client closed the connection"))  # wake the waiting handler
            return


@contextlib.contextmanager
def _watching(group: Group, request: Request) -> Iterator[None]:
    watch = asyncio.create_task(_watch(group, request))
    try:
        yield
    finally:
        watch.cancel()


def plain_overflow(overflow: ContextOverflow) -> ApiError:
    return ApiError(400, str(overflow), param="prompt", code="context_length_exceeded")


def client_error(failure: Failure, request_id: str,
                 overflow: Callable[[ContextOverflow], ApiError] = plain_overflow) -> ApiError:
    """The client's error for a failed sequence; a 500 (the worker's or the engine's fault) says only its error id."""
    if failure.overflow is not None:
        return overflow(failure.overflow)
    if failure.status == 500:
        return internal_error(f"sequence {request_id} failed on its replica: {failure.message!r}")
    return ApiError(failure.status, failure.message, code="service_unavailable" if failure.status == 503 else None)


def replicas_header(group: Group) -> dict[str, str]:
    """The header that names the replica of each of ``group``'s sequences, in input order."""
    return {REPLICAS_HEADER: ",".join(map(str, group.replicas))}


async def collect(group: Group, request: Request,
                  overflow: Callable[[ContextOverflow], ApiError] = plain_overflow) -> list[Choice]:
    """Wait for every sequence of ``group``; the first failure fails the request (the caller closes the group)."""
    choices = new_choices(group)
    with _watching(group, request):
        while not group.finished:
            index, item = await group.next()
            if isinstance(item, Failure):
                raise client_error(item, group.request_ids[index], overflow)
            choices[index].add(item)
    return choices


async def respond(group: Group, render: Renderer, request: Request, stream: bool, n: int) -> Response:
    """Answer an HTTP request from ``group``: one JSON body, or an SSE stream started once the first output is in
    (so a request rejected by its replica still gets a plain 4xx). Its replicas header names where its sequences are
    then (one moved off a suspect replica before it started is named where it ran)."""
    try:
        if not stream:
            choices = await collect(group, request, render.overflow)
            return JSONResponse(render.whole(choices, usage([c.generation for c in choices], n)).model_dump(),
                                headers=replicas_header(group))
        with _watching(group, request):
            first = await group.next()
        if isinstance(first[1], Failure):
            raise client_error(first[1], group.request_ids[first[0]], render.overflow)
    except BaseException:
        group.close()
        raise
    return StreamingResponse(_events(group, first, render, n), media_type="text/event-stream",
                             headers=replicas_header(group), background=BackgroundTask(group.close))


async def _events(group: Group, first: Event, render: Renderer, n: int) -> AsyncIterator[str]:
    """The SSE body. A failure mid-stream is sent as the endpoint's error event (which the SDKs raise), then (OpenAI)
    ``data: [DONE]``: the stream ends as every stream does, and says why.

    Events already queued when the stream gets its turn are written in one piece: under load each write's trip
    through the ASGI middlewares and the socket is the API process's largest cost, and this way it shrinks as
    the load grows instead of falling behind.
    """
    # a stream keeps only each choice's token counts (for usage); its text has gone to the client
    counts = [Generation(rid) for rid in group.request_ids]
    try:
        out = [render.event(opening) for opening in render.opening(len(counts))]
        batch = [first]
        while True:
            for index, item in batch:
                if isinstance(item, Failure):
                    error = client_error(item, group.request_ids[index], render.overflow)
                    note_error(error.message)
                    out.append(render.failed(error))
                    yield "".join(out)
                    return
                counts[index].prompt_tokens = item.output.prompt_tokens
                counts[index].completion_tokens = item.output.completion_tokens
                counts[index].cached_tokens = item.output.cached_tokens
                counts[index].drafted_tokens = item.output.drafted_tokens
                counts[index].accepted_tokens = item.output.accepted_tokens
                out += [render.event(chunk) for chunk in render.chunk(index, item)]
            if group.finished:
                break
            if out:
                yield "".join(out)
                out = []
            batch = [await group.next()]
            batch += group.ready()
        out += [render.event(chunk) for chunk in render.closing(usage(counts, n))]
        out.append(render.end())
        yield "".join(out)
    finally:
        group.close()  # the client may have left: abort whatever still runs
