"""Which of the router's prefix keys this engine's KV holds, reported as changes for the router's index.

The API process routes a request before the worker tokenizes it, so it cuts the prompt's text into blocks and keys
each one by the chain of the blocks before it (:mod:`llamafleet.fleet.affinity`). Those keys travel with the request
(``Request.prefix_keys``), and ``Request.prefix_share`` says how much of the prompt's text they cover. A KV state
holding the first ``n`` of the prompt's ``n_prompt`` tokens holds the keys of the blocks within that share of the
text (:func:`covered`: a block counts once the tokens reach its end, in proportion; a shared text prefix tokenizes to
a shared token prefix, up to the token that straddles the difference).

The engine keeps states in its slots (of finished sequences, :mod:`llamafleet.engine.prefix`; the router counts a
running one as in flight, and once it ended by what its KV kept: all of its prompt, or less if it was cancelled), in
the park (:mod:`llamafleet.engine.kv_park`), the RAM tier and the disk tier (:mod:`llamafleet.engine.kv_tiers`,
:mod:`llamafleet.engine.kv_disk`). A slot's sequence carries its keys; a state that leaves a slot for a tier is named
by the tokens it holds (:func:`~llamafleet.engine.kv_disk.entry_name`, the name the RAM and disk tiers use), and
:meth:`HeldKeys.tag` remembers that name's keys when the slot is given up, so they follow the state from park to RAM
to disk, as its return interval does. :meth:`HeldKeys.change` counts every state held now (each key by how many states
hold it), compares with the last count and returns the keys gained and lost: the live ones (slots, park, RAM) apart
from those on the disk tier, which all replicas of the model share (a replica may restore what another spilled).

Messages stay small: only changes travel, a request carries at most the router's bound of keys, and a state
this engine did not tag (a file another replica wrote, a state restored on its way through the park) holds no keys.
Pure bookkeeping: no llama.cpp calls, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from llamafleet.engine.kv_disk import entry_name
from llamafleet.engine.prefix import Held
from llamafleet.engine.types import Request

Keys = tuple[int, ...]
E = TypeVar("E", bound=Hashable)  # what names a held state


@dataclass(frozen=True)
class HeldChange:
    """Prefix keys an engine's KV gained (``added``) and lost (``dropped``) since its last report: ``live`` for its
    slots, park and RAM tier, ``disk`` for the disk tier its model's replicas share."""

    added: Keys = ()
    dropped: Keys = ()
    disk_added: Keys = ()
    disk_dropped: Keys = ()


class Keyed(Held, Protocol):
    """A slot's sequence as the prefix index sees it (:class:`~llamafleet.engine.prefix.Held`), with its request
    (the keys and their share) and whether it is out of the batch."""

    @property
    def req(self) -> Request: ...

    @property
    def done(self) -> bool: ...


def covered(keys: Keys, share: float, n_prompt: int, n_held: int) -> Keys:
    """The ``keys`` (covering ``share`` of a prompt's text) whose blocks lie within the first ``n_held`` of its
    ``n_prompt`` tokens."""
    if not keys or n_held <= 0:
        return ()
    if n_held >= n_prompt or share <= 0:
        return keys if n_held >= n_prompt else ()
    return keys[:int(len(keys) * n_held / (n_prompt * share))]


class HeldKeys:
    """The keys of the states one engine holds, and what changed since the last :meth:`change`."""

    def __init__(self) -> None:
        self._tags: dict[str, Keys] = {}  # state name -> keys of the prompt it came from
        self._live: dict[Hashable, Keys] = {}  # each live state counted last time -> its keys
        self._disk: dict[str, Keys] = {}
        self._disk_names: list[str] = []  # the disk tier's names at the last count
        self._counts: tuple[Counter[int], Counter[int]] = (Counter(), Counter())  # live, disk: key -> states
        self._names: dict[int, tuple[list[int], str]] = {}  # parked sequence -> (its tokens, their name)

    def tag(self, s: Keyed) -> None:
        """``s``'s slot is given up: a tier may keep its state, under the name of the tokens in its KV."""
        if keys := _covered(s):
            self._tags[entry_name(s.tokens[:s.n_cached])] = keys

    def change(self, slots: Iterable[tuple[int, Keyed]], parked: Iterable[tuple[int, list[int]]],
               ram: Iterable[str], disk: list[str]) -> HeldChange | None:
        """What the states held now (``slots``: slot and sequence; ``parked``: parked sequence and its tokens; the
        names of the RAM and disk tiers' states) gained and lost since the last call; None if nothing."""
        live: dict[Hashable, Keys] = {}
        for slot, s in slots:  # (a running one is counted by the router while it runs: once it ends, by what it kept)
            if s.done and (keys := _covered(s)):
                live[(slot, s.req.request_id, len(keys))] = keys
        names = {}
        for seq, tokens in parked:
            known = self._names.get(seq)
            names[seq] = known if known is not None and known[0] is tokens else (tokens, entry_name(tokens))
            live[names[seq][1]] = self._tags.get(names[seq][1], ())
        self._names = names
        for name in ram:
            live[name] = self._tags.get(name, ())
        on_disk = self._disk if disk == self._disk_names else {name: self._tags.get(name, ()) for name in disk}
        self._disk_names = disk
        if on_disk is self._disk and live.keys() == self._live.keys():  # (most steps: no C-speed work beyond this)
            return None
        added, dropped = _diff(self._live, live, self._counts[0])
        disk_added, disk_dropped = _diff(self._disk, on_disk, self._counts[1])
        self._live, self._disk = live, on_disk
        self._tags = {n: k for n, k in self._tags.items() if n in live or n in on_disk}  # (a state no tier kept)
        if not (added or dropped or disk_added or disk_dropped):
            return None
        return HeldChange(added, dropped, disk_added, disk_dropped)


def _covered(s: Keyed) -> Keys:
    return covered(s.req.prefix_keys, s.req.prefix_share, s.n_prompt, s.n_cached)


def _diff(old: Mapping[E, Keys], new: Mapping[E, Keys], counts: Counter[int]) -> tuple[Keys, Keys]:
    """Count ``new``'s states in and ``old``'s out of ``counts``: the keys that came to be held and those no longer."""
    came: Counter[int] = Counter()
    gone: Counter[int] = Counter()
    for entry in new.keys() - old.keys():
        came.update(new[entry])  # (counted at C speed)
    for entry in old.keys() - new.keys():
        gone.update(old[entry])
    added: list[int] = []
    dropped: list[int] = []
    for k in came.keys() | gone.keys():
        before = counts[k]
        after = before + came[k] - gone[k]
        if after > 0:
            counts[k] = after
            if not before:
                added.append(k)
        else:
            counts.pop(k, None)
            if before:
                dropped.append(k)
    return tuple(added), tuple(dropped)
