"""Prefix affinity: which replica was recently sent the longest prefix of a new prompt.

Each replica's engine keeps the KV of the prompts it ran (in running and idle slots, evicted LRU) and starts a new
sequence from the longest token prefix it already holds. That only helps a request routed to the replica that holds
its prefix, so the router remembers, per replica, the prompts it sent there. The API process has no tokenizer: the
index works on text, and a match here stands for a token match there (a shared text prefix tokenizes to a shared
token prefix, up to the token that straddles the first difference).

Keys: a prompt is cut into :data:`BLOCK_CHARS`-character blocks and each full block gets the hash of (the previous
block's key, its text), so one key stands for the whole prefix that ends with its block (vLLM's chained block
hashes, over characters instead of tokens). A partial last block has no key. A chat is written out first, message
after message, as role and content with separator characters, so a conversation's next turn (which re-sends every
earlier message) starts with the blocks of the turn before; a long system prompt shared by different conversations
matches for as long as it is the same. Chats and plain prompts start from different seeds and never match each other.

Block size: 64 characters, about 16 tokens of English text for LLaMA-family tokenizers (about 4 characters a token),
vLLM's default KV block. Routing only compares how much each replica holds, so finer blocks would cost more hashes per
request for nothing; coarser ones would make short shared prefixes (a system prompt of a few sentences) invisible.

Bound: each replica remembers at most ``capacity`` keys (default :data:`DEFAULT_CAPACITY` = 8192, i.e. 512 Ki
characters of distinct prompt text, about 128 K tokens: the KV of 128 slots x 1024 tokens; 1.4 MB of Python
memory per replica), evicted least recently used. Recording touches a prompt's keys last block first, so its first
block is always the most recent: eviction takes the deepest blocks first and what is left of a prompt is a prefix.
Only the first :data:`MAX_BLOCKS` blocks of a prompt are keyed (64 Ki characters, about 16 K tokens, longer than
any context a replica is likely to run); beyond that length every holder counts as equal.

Pure bookkeeping: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict

from llamafleet.fleet.messages import ChatTurn

BLOCK_CHARS = 64
MAX_BLOCKS = 1024
DEFAULT_CAPACITY = 8192

Prompt = str | tuple[ChatTurn, ...]  # a completion prompt, or a chat's messages in order

_TEXT_SEED = hash("llamafleet prompt")
_CHAT_SEED = hash("llamafleet chat")


def prefix_keys(prompt: Prompt) -> list[int]:
    """The chained key of every full block of ``prompt`` (at most :data:`MAX_BLOCKS`)."""
    if isinstance(prompt, str):
        text, key = prompt, _TEXT_SEED
    else:
        # \x1f between role and content, \x1e after each message: turns cannot run into each other
        text, key = "".join(f"{role}\x1f{content}\x1e" for role, content in prompt), _CHAT_SEED
    keys = []
    for start in range(0, min(len(text) // BLOCK_CHARS, MAX_BLOCKS) * BLOCK_CHARS, BLOCK_CHARS):
        key = hash((key, text[start:start + BLOCK_CHARS]))
        keys.append(key)
    return keys


class PrefixIndex:
    """For each replica, an LRU record of the prompt blocks recently sent there."""

    def __init__(self, n_replicas: int, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a prefix index needs room for at least one block per replica, not {capacity}")
        self.capacity = capacity
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_replicas)]

    def record(self, replica: int, keys: list[int]) -> None:
        """``replica`` was sent a prompt with these ``keys`` (from :func:`prefix_keys`)."""
        held = self._held[replica]
        for key in reversed(keys):  # the first block ends up the most recent: eviction takes the deepest first
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def match(self, keys: list[int]) -> dict[int, int]:
        """Characters of the prompt with these ``keys`` that each replica holds (replicas holding none are left out)."""
        matched = {}
        for replica, held in enumerate(self._held):
            n = 0
            while n < len(keys) and keys[n] in held:
                n += 1
            if n:
                matched[replica] = n * BLOCK_CHARS
        return matched

    def forget(self, replica: int) -> None:
        """``replica``'s engine is gone or new: it holds nothing."""
        self._held[replica].clear()

    def size(self, replica: int) -> int:
        """Blocks remembered for ``replica``."""
        return len(self._held[replica])
