"""Prefix affinity: which replica holds the longest prefix of a new prompt in its KV cache.

Each replica's engine keeps the KV of the prompts it ran (in its slots, and in its park, RAM and disk tiers: see
engine/kv_tiers.py) and starts a new sequence from the longest token prefix it holds. That only helps a request routed
to the replica that holds its prefix. The API process has no tokenizer and routes before the worker tokenizes, so it
keys the prompt's *text*, and a match here stands for a token match there (a shared text prefix tokenizes to a shared
token prefix, up to the token that straddles the first difference).

Where the keys are held comes from the engines themselves: a request's keys travel with it to the worker
(``Submit.prefix_keys``), its engine attaches them to the KV state it keeps for the sequence, carries them with that
state from slot to park to RAM to disk, and reports in its step outputs which keys its KV gained and lost
(:mod:`llamafleet.engine.held_keys`). :class:`PrefixIndex` keeps, per replica, the keys it reports held in its slots,
park or RAM tier, and the keys its disk tier holds; the disk tier is shared by the replicas of a model (any of them can
restore what another spilled), so a key on it counts for every replica that reports reading the same tier (its folder
on the same host: replicas on other hosts cannot read it), at :data:`DISK_WEIGHT` of a live one (a restore from disk
costs a read; a slot or the park costs nothing). Sequences in flight count for their replica until they end (by then
the engine has reported their KV), so copies of one prompt sent together stay together. A replica whose engine does
not report (a remote upstream, the torch engine) is credited, as a guess, with the prompts sent to it: an LRU record
of at most ``capacity`` keys (default :data:`DEFAULT_CAPACITY` = 8192, i.e. 512 Ki characters of distinct prompt text,
about 128 K tokens; 1.4 MB of Python memory per replica), recorded last block first so that what eviction leaves of a
prompt is a prefix.

Keys: a prompt is cut into :data:`BLOCK_CHARS`-character blocks and each full block gets the hash of (the previous
block's key, its text), so one key stands for the whole prefix that ends with its block (vLLM's chained block
hashes, over characters instead of tokens). A partial last block has no key. A chat is written out first, message
after message, as role and content with separator characters, so a conversation's next turn (which re-sends every
earlier message) starts with the blocks of the turn before; a long system prompt shared by different conversations
matches for as long as it is the same. Chats and plain prompts start from different seeds and never match each other.

Block size: 64 characters, about 16 tokens of English text for LLaMA-family tokenizers (about 4 characters a token),
vLLM's default KV block. Routing only compares how much each replica holds, so finer blocks would cost more hashes per
request for nothing; coarser ones would make short shared prefixes (a system prompt of a few sentences) invisible.

Only the first :data:`MAX_BLOCKS` blocks of a prompt are keyed (64 Ki characters, about 16 K tokens, longer than any
context a replica is likely to run): that bounds the keys a request carries; beyond that length every holder counts as
equal.

Pure bookkeeping: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from fractions import Fraction

from llamafleet.engine.held_keys import HeldChange
from llamafleet.fleet.messages import ChatTurn

BLOCK_CHARS = 64
MAX_BLOCKS = 1024
DEFAULT_CAPACITY = 8192
DISK_WEIGHT = Fraction(1, 2)  # what a block on the shared disk tier counts, against one in a slot, the park or RAM

Prompt = str | tuple[ChatTurn, ...]  # a completion prompt, or a chat's messages in order

_TEXT_SEED = hash("llamafleet prompt")
_CHAT_SEED = hash("llamafleet chat")


def _text(prompt: Prompt) -> tuple[str, int]:
    """The text whose blocks are keyed, and the seed of the chain."""
    if isinstance(prompt, str):
        return prompt, _TEXT_SEED
    # \x1f between role and content, \x1e after each message: turns cannot run into each other
    return "".join(f"{role}\x1f{content}\x1e" for role, content in prompt), _CHAT_SEED


def key_share(prompt: Prompt, keys: list[int]) -> float:
    """The share of ``prompt``'s text that its ``keys`` cover (1.0 for a prompt with none)."""
    n = len(_text(prompt)[0])
    return min(1.0, len(keys) * BLOCK_CHARS / n) if n else 1.0


def prefix_keys(prompt: Prompt) -> list[int]:
    """The chained key of every full block of ``prompt`` (at most :data:`MAX_BLOCKS`)."""
    text, key = _text(prompt)
    keys = []
    for start in range(0, min(len(text) // BLOCK_CHARS, MAX_BLOCKS) * BLOCK_CHARS, BLOCK_CHARS):
        key = hash((key, text[start:start + BLOCK_CHARS]))
        keys.append(key)
    return keys


class PrefixIndex:
    """For each replica, the prompt blocks its KV holds (as its engine reports them, or as guessed from what was sent
    there), the blocks of its sequences in flight, and its view of its model's shared disk tier."""

    def __init__(self, n_replicas: int, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a prefix index needs room for at least one block per replica, not {capacity}")
        self.capacity = capacity
        self._reports = [False] * n_replicas  # whether its engine reports what it holds
        self._held: list[set[int]] = [set() for _ in range(n_replicas)]  # reported: slots, park, RAM
        self._disk: list[set[int]] = [set() for _ in range(n_replicas)]  # reported: its view of the disk tier
        self._tier: list[str | None] = [None] * n_replicas  # the disk tier it reads (one folder on one host)
        self._on_disk: dict[str, Counter[int]] = {}  # disk tier -> key -> replicas whose view of it holds the key
        self._sent: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_replicas)]  # guessed
        self._flight: list[Counter[int]] = [Counter() for _ in range(n_replicas)]  # key -> sequences in flight

    def record(self, replica: int, keys: list[int]) -> None:
        """A sequence with these ``keys`` (from :func:`prefix_keys`) was sent to ``replica``; :meth:`done` when it
        ends."""
        self._flight[replica].update(keys)
        if self._reports[replica]:
            return
        sent = self._sent[replica]
        for key in reversed(keys):  # the first block ends up the most recent: eviction takes the deepest first
            sent[key] = None
            sent.move_to_end(key)
        while len(sent) > self.capacity:
            sent.popitem(last=False)

    def done(self, replica: int, keys: list[int]) -> None:
        """A sequence :meth:`record`-ed on ``replica`` ended (or moved away)."""
        flight = self._flight[replica]
        flight.subtract(keys)
        for key in keys:
            if flight[key] <= 0:
                del flight[key]

    def update(self, replica: int, change: HeldChange) -> None:
        """``replica``'s engine reports what its KV gained and lost."""
        held, disk = self._held[replica], self._disk[replica]
        held.difference_update(change.dropped)
        held.update(change.added)
        tier = self._tier[replica]
        if tier is None:
            return
        on_disk = self._on_disk.setdefault(tier, Counter())
        for key in change.disk_dropped:
            if key in disk:
                disk.discard(key)
                _uncount(on_disk, key)
        for key in change.disk_added:
            if key not in disk:
                disk.add(key)
                on_disk[key] += 1

    def match(self, keys: list[int]) -> dict[int, int]:
        """Characters of the prompt with these ``keys`` that each replica holds, a block on the shared disk tier
        counting :data:`DISK_WEIGHT` of one (replicas holding none are left out)."""
        matched = {}
        for replica, tier in enumerate(self._tier):
            held, flight, sent = self._held[replica], self._flight[replica], self._sent[replica]
            n = 0
            while n < len(keys) and (keys[n] in held or keys[n] in flight or keys[n] in sent):
                n += 1
            m = n
            on_disk = self._on_disk.get(tier, ()) if tier is not None else ()
            while m < len(keys) and keys[m] in on_disk:
                m += 1
            chars = int((n + (m - n) * DISK_WEIGHT) * BLOCK_CHARS)
            if chars:
                matched[replica] = chars
        return matched

    def forget(self, replica: int, reports: bool = False, disk_tier: str | None = None) -> None:
        """``replica``'s engine is gone or new: it holds nothing; ``reports``: the new one reports what it holds, and
        reads the disk tier named ``disk_tier`` (its folder and host: replicas naming the same one share it)."""
        tier = self._tier[replica]
        for key in self._disk[replica]:
            assert tier is not None
            _uncount(self._on_disk[tier], key)
        self._reports[replica] = reports
        self._tier[replica] = disk_tier if reports else None
        self._held[replica].clear()
        self._sent[replica].clear()
        self._flight[replica].clear()
        self._disk[replica].clear()

    def size(self, replica: int) -> int:
        """Blocks remembered for ``replica`` (held by its KV or guessed, and in flight there)."""
        return len(self._held[replica] | self._sent[replica].keys() | self._flight[replica].keys())


def _uncount(counts: Counter[int], key: int) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
