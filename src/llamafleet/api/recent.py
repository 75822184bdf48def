"""The recent requests and errors the dashboard lists, kept in the API process: the last :data:`KEEP_REQUESTS`
requests and :data:`KEEP_ERRORS` errors.

An entry says when, the method, the route (its template, e.g. ``/v1/models/{model_id:path}``; unknown paths are
``other``, so a path never carries what a client typed), the status, the latency to the answer's last byte, the
token counts when the answer carried usage, the replicas that ran it, and for a failure the error message the client
got (a message may quote up to 80 characters of an invalid parameter). What was asked and answered is kept only when
the operator sets ``recent_request_contents: true``: then the first :data:`CONTENT_BYTES` bytes of the request body
and of the answer (for a stream, its raw events) go with the entry. Off by default: prompts are the users' business.

The probes (``/health``, ``/ready``) are never listed; ``/metrics``, ``/v1/status`` and the page's own files only
when they fail: the dashboard's own polling would push everything else out.

:class:`~llamafleet.api.middleware.HttpMetrics` opens and closes the entries; what only a handler knows (usage, an
error in the middle of a stream) it adds with :func:`note_usage` and :func:`note_error`, which find the request's
entry through a context variable (a streamed body's task inherits it).
"""

from __future__ import annotations

import collections
import contextvars
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.types import Message, Receive, Scope

from llamafleet.engine.types import CacheOrigin

KEEP_REQUESTS = 100
KEEP_ERRORS = 50
CONTENT_BYTES = 2048
ERROR_BODY_BYTES = 8192  # an error body read for its message: ours are far smaller
PROBES = ("/health", "/ready")  # never listed: a 503 from /ready while loading is an answer, not an error
QUIET_PATHS = ("/metrics", "/v1/status", "/ui")  # listed only when they fail
REPLICAS_HEADER = b"x-llamafleet-replicas"

_CURRENT: contextvars.ContextVar[Entry | None] = contextvars.ContextVar("llamafleet_recent", default=None)


@dataclass
class Entry:
    """One request, as the dashboard lists it."""

    t: float  # Unix time it arrived
    method: str
    route: str = "other"
    status: int = 0
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # of those, how many came from a slot, the RAM tier and the disk tier, and, for a prompt not served whole, the
    # token index where it first differed from the longest prefix any slot or tier held (engine/kv_tiers.py) and,
    # for a chat, the message (from 0) that token falls in
    cache: dict[str, int | None] | None = None
    replicas: str | None = None  # the x-llamafleet-replicas header: which replica ran each choice
    error: str | None = None
    request_body: str | None = None  # only with recent_request_contents
    response_body: str | None = None
    _body: bytearray = field(default_factory=bytearray, repr=False)  # the answer's first bytes, while it is sent
    _asked: bytearray = field(default_factory=bytearray, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def note_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
               origins: Sequence[CacheOrigin] = ()) -> None:
    """Token counts of the request being answered (no-op outside one), and where its prompts' cached tokens came
    from (``origins``: one per prompt; the first differing token is the first prompt's)."""
    entry = _CURRENT.get()
    if entry is not None:
        entry.prompt_tokens, entry.completion_tokens, entry.cached_tokens = prompt_tokens, completion_tokens, \
            cached_tokens
        if origins:
            entry.cache = {"slot": sum(o.slot for o in origins), "park": sum(o.park for o in origins),
                           "ram": sum(o.ram for o in origins),
                           "disk": sum(o.disk for o in origins), "differs_at": origins[0].differs_at,
                           "differs_in_message": origins[0].differs_in_message}


def note_error(message: str) -> None:
    """An error the client got inside an answer that had already started (a stream's error event)."""
    entry = _CURRENT.get()
    if entry is not None:
        entry.error = message


def _error_message(body: bytes, status: int) -> str:
    """The message of one of our error bodies (OpenAI's and Anthropic's both have ``error.message``)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"
    return str(message)


def _text(data: bytes) -> str:
    return data[:CONTENT_BYTES].decode("utf-8", errors="replace")


class RecentRequests:
    """The two rings, and the hooks :class:`~llamafleet.api.middleware.HttpMetrics` calls."""

    def __init__(self, contents: bool = False) -> None:
        self.contents = contents
        self.requests: collections.deque[Entry] = collections.deque(maxlen=KEEP_REQUESTS)
        self.errors: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_ERRORS)

    def begin(self, scope: Scope) -> Entry:
        """A new entry for the request of ``scope``, current in this context from now on."""
        entry = Entry(time.time(), str(scope["method"]))
        _CURRENT.set(entry)
        return entry

    def watch_receive(self, entry: Entry, receive: Receive) -> Receive:
        """``receive``, keeping the body's first bytes on ``entry`` when contents are kept."""
        if not self.contents:
            return receive

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(entry._asked) < CONTENT_BYTES:
                entry._asked += message.get("body", b"")[:CONTENT_BYTES]
            return message

        return watched

    def sent(self, entry: Entry, message: Message) -> None:
        """Look at one message of the answer on its way out."""
        if message["type"] == "http.response.start":
            entry.status = int(message["status"])
            entry.replicas = next((v.decode("latin-1") for k, v in message.get("headers", ())
                                   if k.lower() == REPLICAS_HEADER), None)
        elif message["type"] == "http.response.body":
            keep = ERROR_BODY_BYTES if entry.status >= 400 else CONTENT_BYTES if self.contents else 0
            if len(entry._body) < keep:
                entry._body += message.get("body", b"")[:keep]

    def end(self, entry: Entry, route: str, status: int, latency_s: float) -> None:
        """The answer's last byte went out (or the client left): list the entry."""
        if route in PROBES:
            return
        entry.route, entry.status, entry.latency_s = route, status, round(latency_s, 4)
        if status >= 400:
            entry.error = _error_message(bytes(entry._body), status)
        if self.contents:
            entry.request_body, entry.response_body = _text(bytes(entry._asked)), _text(bytes(entry._body))
        entry._body, entry._asked = bytearray(), bytearray()
        if entry.error is not None:
            self.errors.append({"t": entry.t, "source": f"{entry.method} {route}", "status": status,
                                "message": entry.error})
        elif route.startswith(QUIET_PATHS):
            return
        self.requests.append(entry)

    def replica_error(self, replica: str, message: str) -> None:
        """A replica stopped (crash, hang, failed load): its reason goes on the errors list."""
        self.errors.append({"t": time.time(), "source": f"replica {replica}", "status": None, "message": message})
