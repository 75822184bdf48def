"""The park tier on the real model, on CPU: a slot's KV moved into a spare sequence of the same context (queued
stream copies, no host copy) and back, with the same greedy answers as a session that kept its slot; a full park
spills to the RAM tier, and a RAM state whose slot is still being parked goes through a parked sequence; the router's
prefix keys of a session stay reported held while its KV is in the slot, the park or RAM, and are dropped with it."""

from __future__ import annotations

from pathlib import Path

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from test_kv_tiers import GREEDY, SESSIONS, cfg, chat, kept_slot, run, turn2, two_turns

from llamafleet.engine.types import Request

MIB = 1 << 20


def test_parked_sessions_come_back_with_the_answers_of_a_kept_slot(model_path: Path) -> None:
    with Engine(cfg(model_path, n_park=SESSIONS)) as eng:
        first, second = two_turns(eng, together=False)
        t = eng.stats().tiers
        assert eng.stats().kv_tokens_total == 2 * 512  # the slots' KV; the parked sequences' is not theirs to use
    assert t is not None and t.parks >= SESSIONS - 1 and t.hits["park"] >= SESSIONS - 1
    assert t.saves == 0 and t.hits["ram"] == 0  # nothing went through host memory
    assert t.park_limit == SESSIONS and 0 < t.park_entries <= SESSIONS
    for i in range(SESSIONS):
        g = second[f"s{i}"]
        assert g.cached_tokens >= first[f"s{i}"].prompt_tokens
        assert g.cache is not None and g.cache.slot + g.cache.park + g.cache.ram + g.cache.disk == g.cached_tokens
    assert sum(second[f"s{i}"].cache.park for i in range(SESSIONS)) == t.tokens["park"]  # type: ignore[union-attr]
    for key, (one, two) in kept_slot(model_path).items():
        assert (first[key].token_ids, second[key].token_ids) == (one.token_ids, two.token_ids)


def test_a_full_park_spills_to_ram_and_ram_states_come_back_through_it(model_path: Path) -> None:
    with Engine(cfg(model_path, n_park=1, cache_ram_bytes=256 * MIB)) as eng:
        first, second = two_turns(eng, together=False)
        t = eng.stats().tiers
    # one parked session (and the spare) for three waiting: the least recently parked went to RAM, and came back into
    # the slot through the parked sequence while the slot's own KV was being parked
    assert t is not None and t.evictions["park"] >= 2 and t.saves >= 2 and t.hits["ram"] >= 2
    assert t.hits["park"] + t.hits["ram"] >= SESSIONS - 1 and t.failed_restores == 0
    for key, (one, two) in kept_slot(model_path).items():
        assert (first[key].token_ids, second[key].token_ids) == (one.token_ids, two.token_ids)
        assert second[key].cached_tokens >= first[key].prompt_tokens


def test_the_slot_s_old_kv_never_takes_the_parked_sequence_its_next_prompt_restores(model_path: Path) -> None:
    # one slot, one parked sequence: s0 is parked when s1 takes the slot; s0's next turn must find it there, not
    # see it pushed out by s1's KV being parked first
    with Engine(cfg(model_path, n_seq=1, n_park=1)) as eng:
        first = run(eng, {f"s{i}": chat(i, [], "What is the first word?") for i in range(2)}, together=False)
        again = run(eng, {"s0": turn2(0, first["s0"])})["s0"]
    assert again.cache is not None and again.cache.park >= first["s0"].prompt_tokens


def test_a_cancelled_turn_restored_from_the_park_keeps_the_session_s_kv(model_path: Path) -> None:
    with Engine(cfg(model_path, n_seq=1, n_park=1)) as eng:
        first = run(eng, {f"s{i}": chat(i, [], "What is the first word?") for i in range(2)}, together=False)
        s0 = Request("c0", tuple(eng.tokenize_chat(turn2(0, first["s0"]))), GREEDY)
        eng.add_request(s0)
        eng.step()  # admitted: s1's KV parked, s0's restored from the park into the slot, its prefill launched
        assert eng.stats().tiers.hits["park"] == 1  # type: ignore[union-attr]
        eng.abort("c0")
        while eng.has_work():
            eng.step()
        run(eng, {"s1": turn2(1, first["s1"])})  # takes the slot: s0's KV must be parked again, not lost
        again = run(eng, {"s0": turn2(0, first["s0"])})["s0"]
    assert again.cache is not None and again.cache.park >= first["s0"].prompt_tokens


def test_sessions_cycling_through_a_smaller_park_still_come_back_from_it(model_path: Path) -> None:
    # four sessions in turn on one slot and two parked sequences: the least recently parked is always the next to
    # return, so LRU would restore none of them; the park keeps the sessions it holds until they return
    with Engine(cfg(model_path, n_seq=1, n_park=2)) as eng:
        turns = {f"s{i}": chat(i, [], "What is the first word?") for i in range(SESSIONS)}
        for _ in range(3):
            run(eng, turns, together=False)
        t = eng.stats().tiers
    assert t is not None and t.evictions["park"] >= 2
    assert t.hits["park"] >= 3  # of the 8 later turns (LRU: 0)


def test_a_session_s_prefix_keys_are_held_while_a_tier_keeps_its_kv_and_dropped_with_it(model_path: Path) -> None:
    keys = {i: tuple(range(1000 * i, 1000 * i + 8)) for i in range(3)}  # what the router would send with each
    held: set[int] = set()

    def turn(eng: Engine, i: int) -> None:
        eng.generate([Request(f"s{i}", tuple(eng.tokenize_chat(chat(i, [], "What is the first word?"))), GREEDY,
                              prefix_keys=keys[i])])
        change = eng.held_change()
        assert change is not None and not change.disk_added
        held.difference_update(change.dropped)
        held.update(change.added)

    # one slot, one parked sequence, no RAM tier: s0 is parked when s1 takes the slot, and given up when s2 does
    with Engine(cfg(model_path, n_seq=1, n_park=1)) as eng:
        turn(eng, 0)
        assert held == set(keys[0])
        turn(eng, 1)
        assert held == set(keys[0]) | set(keys[1])
        turn(eng, 2)
        assert held == set(keys[1]) | set(keys[2])
    held.clear()
    # with a RAM tier, what leaves the park for room is saved there: s0's keys stay held
    with Engine(cfg(model_path, n_seq=1, n_park=1, cache_ram_bytes=256 * MIB)) as eng:
        for i in range(3):
            turn(eng, i)
        assert eng.stats().tiers.ram_entries == 1  # type: ignore[union-attr]
    assert held == set(keys[0]) | set(keys[1]) | set(keys[2])
