"""Stored responses: what ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}`` and ``.../input_items`` read.

A stored response keeps the response object (as ``GET`` returns it) and its conversation: every input item it was
generated from (the previous responses' conversation first, then this request's input), each in the canonical shape
``input_items`` lists, with an id. A request that names it as ``previous_response_id`` continues that conversation
plus the response's own output items, so the engine sees the whole conversation again and its prefix cache serves the
part it has already computed.

Everything lives in the API process's memory, bounded three ways (``responses_store_max`` responses,
``responses_store_mib`` bytes, each kept ``responses_ttl_s`` after it was stored): the oldest go first. A response's
bytes are the Python objects of its object and its whole conversation (:func:`footprint`), counted again wherever
they are shared (a continued conversation holds the items of the one it continues, dictionary keys repeat): the count
can only overstate what is held, so the bound holds. A response larger than the whole bound is not kept. Each
belongs to the API key that created it (by the key's SHA-256; without a key, to "no key"): any other key finds
nothing, as if the id were unknown.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from llamafleet.api.errors import ApiError
from llamafleet.api.middleware import presented_key

log = logging.getLogger(__name__)

JsonItem = dict[str, Any]


def footprint(value: object) -> int:
    """The bytes of the Python objects of ``value`` (JSON-like: dicts, lists, strings, numbers), each object counted
    wherever it appears."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(footprint(k) + footprint(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return size + sum(footprint(v) for v in value)
    return size


def owner_of(scope: Scope) -> str:
    """Who a request's stored responses belong to: the hex SHA-256 of the API key it presented, or "" for none."""
    key = presented_key(scope)
    return hashlib.sha256(key).hexdigest() if key else ""


def not_found(rid: str, param: str | None = None) -> ApiError:
    """OpenAI's 404 for an id that is unknown, expired, deleted or another key's (all alike, on purpose)."""
    if param == "previous_response_id":
        return ApiError(404, f"Previous response with id '{rid}' not found.", param=param,
                        code="previous_response_not_found")
    return ApiError(404, f"Response with id '{rid}' not found.", param=param)


@dataclass(frozen=True)
class Stored:
    """One stored response: its owner, object (JSON) and the input items it was generated from."""

    owner: str
    response: JsonItem
    inputs: tuple[JsonItem, ...]
    stored_at: float
    size: int

    @property
    def conversation(self) -> tuple[JsonItem, ...]:
        """What a response continuing this one starts from: its inputs, then its output items."""
        return (*self.inputs, *self.response["output"])


class ResponseStore:
    """Stored responses by id, oldest first, bounded by count, bytes and age. Used from the event loop only."""

    def __init__(self, max_count: int, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, rid: str, owner: str, response: JsonItem, inputs: tuple[JsonItem, ...]) -> bool:
        """Keep a finished response; False when it is not kept (none are, or it alone is larger than the bound)."""
        if self.max_count == 0:
            return False
        size = footprint(response) + footprint(inputs)
        if size > self.max_bytes:
            log.warning("response %s is not stored: its conversation (%d bytes) is larger than responses_store_mib",
                        rid, size)
            return False
        self._expire()
        while self._entries and (len(self._entries) >= self.max_count or self.bytes + size > self.max_bytes):
            self._drop(next(iter(self._entries)))
        self._entries[rid] = Stored(owner, response, inputs, self._clock(), size)
        self.bytes += size
        return True

    def get(self, rid: str, owner: str, param: str | None = None) -> Stored:
        """The response ``rid`` of ``owner``; the 404 of :func:`not_found` (naming ``param``) otherwise."""
        self._expire()
        entry = self._entries.get(rid)
        if entry is None or entry.owner != owner:
            raise not_found(rid, param)
        return entry

    def delete(self, rid: str, owner: str) -> None:
        """Forget ``rid``; 404 if ``owner`` has no such response."""
        self.get(rid, owner)
        self._drop(rid)

    def _drop(self, rid: str) -> None:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self.bytes -= entry.size

    def _expire(self) -> None:
        """Drop the responses older than the TTL (the oldest are first)."""
        limit = self._clock() - self.ttl_s
        while self._entries:
            rid, oldest = next(iter(self._entries.items()))
            if oldest.stored_at > limit:
                return
            self._drop(rid)
