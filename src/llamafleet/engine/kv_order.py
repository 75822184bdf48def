"""Which saved KV state a full tier gives up: the one whose session is expected back last.

Least recently used fails the traffic the tiers are for: sessions that come back in turn, more of them than a tier
holds. In such a cycle the least recently used state is the one whose session comes back next, so LRU never hits.
Instead each state expects its session back after the session's **return interval**: the number of slot turnovers
(:class:`Clock`) between the state's last use and its session's return, learned at each return (a hit) and carried
to the state saved after it. A session not yet seen returning is given the longest interval of the states held, and
at least twice as many turnovers as the tier holds states (so one session that came back after hours does not keep
every newcomer out once it is gone). A full tier gives up, in this order:

1. a state whose session is **overdue**: not back after twice its interval (the session ended or went quiet), the
   longest unused first;
2. else the state **expected back last** (its last use plus its interval); among equals the most recently saved.

In a cycle longer than the tier every interval is the same, so the newest state goes and the others stay until their
sessions return: of N sessions cycling through C places about C - 1 hit each round (none under LRU), for cycles up to
four times the tier before anything was learned, any length after. Sessions that come back sooner than others are
kept, as under LRU, and the states of sessions that stopped coming go after twice their interval, so a new set of
sessions takes the tier over. Pure bookkeeping: the tiers (:mod:`llamafleet.engine.kv_park`,
:mod:`llamafleet.engine.kv_tiers`) keep the states and ask :meth:`ReturnOrder.victim` which one to give up.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Clock:
    """Slot turnovers of one engine (a slot's KV given up for another prompt): the time of return intervals."""

    def __init__(self) -> None:
        self.now = 0

    def tick(self) -> None:
        self.now += 1


@dataclass
class _Use:
    last: int  # when the state was saved or last restored
    interval: int | None  # turnovers between a use and its session's return (None: not seen returning)


class ReturnOrder(Generic[K]):
    """When each state of one tier (keyed by ``K``) was last used and how soon its session comes back."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._uses: dict[K, _Use] = {}

    def add(self, key: K, interval: int | None = None) -> None:
        """A state was saved now; ``interval``: its session's, if it was learned (the state it extends)."""
        self._uses[key] = _Use(self.clock.now, interval)

    def hit(self, key: K) -> int:
        """The state's session came back now: learn its interval (returned, to be carried to its next state)."""
        use = self._uses[key]
        use.interval = max(1, self.clock.now - use.last)
        use.last = self.clock.now
        return use.interval

    def interval(self, key: K) -> int | None:
        use = self._uses.get(key)
        return None if use is None else use.interval

    def drop(self, key: K) -> None:
        self._uses.pop(key, None)

    def victim(self, keys: Iterable[K]) -> K | None:
        """The state among ``keys`` (each added) to give up for room (see the module's docstring); None if none."""
        now = self.clock.now
        unknown = max([2 * len(self._uses), 1] + [u.interval for u in self._uses.values() if u.interval])
        best: K | None = None
        rank: tuple[int, int, int] | None = None
        for key in keys:
            use = self._uses[key]
            interval = use.interval or unknown
            age = now - use.last
            r = (1, age, 0) if age > 2 * interval else (0, use.last + interval, use.last)
            if rank is None or r > rank:
                best, rank = key, r
        return best
