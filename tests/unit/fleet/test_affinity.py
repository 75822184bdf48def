"""The prefix index: chained block keys of prompts and chats; per replica, what its engine reports its KV holds (and
the model's shared disk tier), or, for a replica that does not report, an LRU record of what was sent; matching and
forgetting."""

from __future__ import annotations

import pytest

from llamafleet.engine.held_keys import HeldChange
from llamafleet.fleet.affinity import BLOCK_CHARS, DISK_WEIGHT, MAX_BLOCKS, PrefixIndex, key_share, prefix_keys

SYSTEM = "You are a careful assistant for a hardware shop. Answer in one short paragraph. " * 4  # 320 chars


def _turns(*contents: str) -> tuple[tuple[str, str], ...]:
    """A conversation: the system prompt, then user and assistant turns alternating."""
    roles = ["user", "assistant"]
    return (("system", SYSTEM), *((roles[i % 2], c) for i, c in enumerate(contents)))


def test_keys_are_chained_full_blocks() -> None:
    text = "a" * BLOCK_CHARS + "b" * BLOCK_CHARS + "c" * (BLOCK_CHARS - 1)
    keys = prefix_keys(text)
    assert len(keys) == 2  # the partial last block has no key
    assert prefix_keys(text + "c")[:2] == keys and len(prefix_keys(text + "c")) == 3
    # the same block after a different first block is another key: a key stands for the whole prefix
    assert prefix_keys("z" * BLOCK_CHARS + "b" * BLOCK_CHARS)[1] != keys[1]
    assert prefix_keys("short") == []
    assert len(prefix_keys("x" * BLOCK_CHARS * (MAX_BLOCKS + 5))) == MAX_BLOCKS


def test_a_prompt_matches_the_replica_it_was_sent_to_up_to_where_it_differs() -> None:
    index = PrefixIndex(3)
    sent = "Context: " + "the quick brown fox jumps over the lazy dog. " * 20
    index.record(1, prefix_keys(sent))
    follow_up = sent[:500] + " A different ending that shares only the first 500 characters."
    assert index.match(prefix_keys(follow_up)) == {1: 500 // BLOCK_CHARS * BLOCK_CHARS}
    assert index.match(prefix_keys(sent + " and more")) == {1: len(sent) // BLOCK_CHARS * BLOCK_CHARS}
    assert index.match(prefix_keys("Something else entirely. " * 20)) == {}


def test_a_conversations_next_turn_extends_its_match() -> None:
    index = PrefixIndex(2)
    history: list[str] = []
    matched = []
    for turn in range(4):
        history.append(f"Question {turn}: which screwdriver fits an M{turn + 3} screw, and why?")
        chat = _turns(*history)
        matched.append(index.match(prefix_keys(chat)).get(0, 0))
        index.record(0, prefix_keys(chat))
        history.append(f"Answer {turn}: a number {turn + 1} Phillips, because the head is that size.")
    assert matched[0] == 0
    assert matched[1] >= len(SYSTEM)  # the system prompt and the first question
    assert matched[1] < matched[2] < matched[3]  # each turn holds everything the turn before sent


def test_different_system_prompts_do_not_match_and_chat_is_not_text() -> None:
    index = PrefixIndex(2)
    index.record(0, prefix_keys(_turns("Hello, how are you today? I would like some advice about drills.")))
    other = (("system", "Tu es un assistant qui répond en français. " * 8),
             ("user", "Hello, how are you today? I would like some advice about drills."))
    assert index.match(prefix_keys(other)) == {}
    index.record(1, prefix_keys(SYSTEM * 2))  # the system text as a plain prompt is another thing
    assert 1 not in index.match(prefix_keys(_turns("Hi")))


def test_the_bound_evicts_the_oldest_and_leaves_a_prefix() -> None:
    index = PrefixIndex(1, capacity=8)
    first = prefix_keys("A" * BLOCK_CHARS * 6)
    second = prefix_keys("B" * BLOCK_CHARS * 6)

    def sent(keys: list[int]) -> None:  # a sequence sent there, and finished
        index.record(0, keys)
        index.done(0, keys)

    sent(first)
    sent(second)  # 12 blocks into room for 8: the deepest 4 of the first prompt go
    assert index.size(0) == 8
    assert index.match(first) == {0: 2 * BLOCK_CHARS}  # what is left of it is still its prefix
    assert index.match(second) == {0: 6 * BLOCK_CHARS}
    sent(first[:1])  # using a prefix again keeps it
    sent(prefix_keys("C" * BLOCK_CHARS * 7))
    assert index.match(first) == {0: BLOCK_CHARS}
    assert index.match(second) == {}  # older than the first block of the first prompt, which was just reused


def test_a_replica_reset_forgets_only_that_replica() -> None:
    index = PrefixIndex(2)
    keys = prefix_keys(SYSTEM)
    index.record(0, keys)
    index.record(1, keys)
    index.forget(0)
    assert index.match(keys) == {1: len(SYSTEM) // BLOCK_CHARS * BLOCK_CHARS}
    assert index.size(0) == 0


def test_bad_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        PrefixIndex(1, capacity=0)


def test_the_share_of_the_text_the_keys_cover() -> None:
    text = "x" * (BLOCK_CHARS * 3 + BLOCK_CHARS // 2)
    assert key_share(text, prefix_keys(text)) == pytest.approx(3 / 3.5)
    assert key_share("short", []) == 0.0 and key_share("", []) == 1.0


def test_a_reporting_replica_holds_what_its_engine_reports_not_what_was_sent() -> None:
    index = PrefixIndex(2)
    index.forget(0, reports=True)
    keys = prefix_keys(SYSTEM)
    index.record(0, keys)
    assert index.match(keys) == {0: len(keys) * BLOCK_CHARS}  # in flight: it will be there
    index.done(0, keys)
    assert index.match(keys) == {}  # sent and finished, but its engine reported nothing kept
    index.update(0, HeldChange(added=tuple(keys)))
    assert index.match(keys) == {0: len(keys) * BLOCK_CHARS}
    index.update(0, HeldChange(dropped=tuple(keys[2:])))  # its tier gave up the deeper blocks
    assert index.match(keys) == {0: 2 * BLOCK_CHARS}
    index.update(0, HeldChange(dropped=tuple(keys[:2])))
    assert index.match(keys) == {}
    # a replica that does not report keeps the old guess: what was sent there
    index.record(1, keys)
    index.done(1, keys)
    assert index.match(keys) == {1: len(keys) * BLOCK_CHARS}


def test_the_shared_disk_tier_counts_for_every_replica_reading_it_at_a_lower_weight() -> None:
    index = PrefixIndex(4)
    index.forget(0, reports=True, disk_tier="host-a:/kv")
    index.forget(1, reports=True, disk_tier="host-a:/kv")
    index.forget(3, reports=True, disk_tier="host-b:/kv")  # another host: it cannot read host-a's files
    # replica 2 does not report (a remote upstream): it cannot read the disk tier either
    keys = prefix_keys(SYSTEM * 2)
    full, n = len(keys) * BLOCK_CHARS, len(keys)
    index.update(0, HeldChange(added=tuple(keys[:3]), disk_added=tuple(keys)))  # 3 blocks live, all spilled
    assert index.match(keys) == {0: int((3 + (n - 3) * DISK_WEIGHT) * BLOCK_CHARS), 1: int(full * DISK_WEIGHT)}
    index.update(1, HeldChange(disk_added=tuple(keys[:4])))  # replica 1's view of the same files, as it scanned them
    index.update(0, HeldChange(disk_dropped=tuple(keys)))  # replica 0 saw them evicted; replica 1 not yet
    assert index.match(keys) == {0: 3 * BLOCK_CHARS + int(1 * DISK_WEIGHT * BLOCK_CHARS),
                                 1: int(4 * DISK_WEIGHT * BLOCK_CHARS)}
    index.forget(1, reports=True, disk_tier="host-a:/kv")  # restarted: its view is gone with it
    assert index.match(keys) == {0: 3 * BLOCK_CHARS}
    index.update(3, HeldChange(disk_added=tuple(keys)))
    assert index.match(keys) == {0: 3 * BLOCK_CHARS, 3: int(full * DISK_WEIGHT)}  # host-b's files are its own
