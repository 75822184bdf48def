"""Each tenant's limits, checked when a request is admitted (before its body is read), in the API's event loop.

* ``requests_per_minute`` and ``tokens_per_minute``: a bucket holding a minute's worth, refilled continuously (so a
  quiet tenant may burst up to a minute's worth at once). A request takes one request at admission.
* Tokens are counted as they are really used, never reserved: the prompt when the engine reports it (its tokens
  served from the prefix cache weighted by the keys file's ``cached_token_weight``), each output token as it is
  produced. A request is admitted while the tenant's token bucket is above zero; one that is admitted runs to its
  end, so a tenant may overshoot by what its requests in flight use (the bucket goes below zero, and the next
  request waits until it is refilled above zero).
* ``tokens_per_day``: per UTC day; refused once the day's count reaches it, until midnight UTC.
* ``concurrent``: requests in flight (admitted, answer not yet complete).

Over a limit: :class:`Refusal` says which, and after how many seconds a retry can pass (``Retry-After``). Nothing is
taken from any bucket by a refused request. The state of a tenant is kept by name across reloads of the keys file.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llamafleet.tenants.keys import Limits, Tenant

DAY_S = 86400


@dataclass(frozen=True)
class Refusal:
    """A request refused for ``limit`` (the name of the limit as the keys file spells it)."""

    limit: str
    message: str
    retry_after_s: int


@dataclass
class _Bucket:
    level: float
    at: float

    def refill(self, per_minute: int, now: float) -> float:
        self.level = min(float(per_minute), self.level + (now - self.at) * per_minute / 60.0)
        self.at = now
        return self.level


@dataclass
class _State:
    requests: _Bucket
    tokens: _Bucket
    day: int = 0
    day_tokens: float = 0.0
    inflight: int = 0
    limits: Limits = field(default_factory=Limits)


class Limiter:
    """Admission and accounting for every tenant with limits; ``clock``: monotonic seconds, ``wall``: Unix time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._clock, self._wall = clock, wall
        self._states: dict[str, _State] = {}

    def _state(self, tenant: Tenant) -> _State:
        s = self._states.get(tenant.name)
        if s is None:
            now, lim = self._clock(), tenant.limits
            s = self._states[tenant.name] = _State(_Bucket(float(lim.requests_per_minute or 0), now),
                                                   _Bucket(float(lim.tokens_per_minute or 0), now))
        s.limits = tenant.limits  # a reload may have changed them
        return s

    def admit(self, tenant: Tenant) -> Refusal | None:
        """Take one request and one place in flight for ``tenant``, or say which limit refuses it."""
        lim = tenant.limits
        s = self._state(tenant)
        now = self._clock()
        if lim.concurrent is not None and s.inflight >= lim.concurrent:
            return Refusal("concurrent", f"the key '{tenant.name}' has {s.inflight} requests in flight, its limit "
                                         f"(concurrent: {lim.concurrent}); wait for one to finish", 1)
        if lim.tokens_per_day is not None and self._today(s).day_tokens >= lim.tokens_per_day:
            left = DAY_S - self._wall() % DAY_S
            return Refusal("tokens_per_day", f"the key '{tenant.name}' used {s.day_tokens:.0f} tokens today (UTC), "
                                             f"its limit (tokens_per_day: {lim.tokens_per_day})", _ceil(left))
        if lim.tokens_per_minute is not None and s.tokens.refill(lim.tokens_per_minute, now) <= 0:
            wait = (1 - s.tokens.level) * 60.0 / lim.tokens_per_minute
            return Refusal("tokens_per_minute", f"the key '{tenant.name}' used its tokens per minute "
                                                f"(tokens_per_minute: {lim.tokens_per_minute})", _ceil(wait))
        if lim.requests_per_minute is not None:
            if s.requests.refill(lim.requests_per_minute, now) < 1:
                wait = (1 - s.requests.level) * 60.0 / lim.requests_per_minute
                return Refusal("requests_per_minute", f"the key '{tenant.name}' sent more requests than its limit "
                                                      f"(requests_per_minute: {lim.requests_per_minute})", _ceil(wait))
            s.requests.level -= 1
        s.inflight += 1
        return None

    def release(self, tenant: Tenant) -> None:
        """A request admitted by :meth:`admit` is over."""
        s = self._states.get(tenant.name)
        if s is not None and s.inflight:
            s.inflight -= 1

    def charge(self, tenant: Tenant, tokens: float) -> None:
        """``tenant`` used ``tokens`` (prompt, weighted, or output)."""
        s = self._state(tenant)
        if s.limits.tokens_per_minute is not None:
            s.tokens.refill(s.limits.tokens_per_minute, self._clock())
            s.tokens.level -= tokens
        if s.limits.tokens_per_day is not None:
            self._today(s).day_tokens += tokens

    def _today(self, s: _State) -> _State:
        """``s`` with its day's count reset when the UTC day changed."""
        day = int(self._wall() // DAY_S)
        if day != s.day:
            s.day, s.day_tokens = day, 0.0
        return s


def _ceil(seconds: float) -> int:
    return max(1, math.ceil(seconds))
