"""Prefix reuse on the real model, on CPU: the same greedy answers with the cache on and off, and the cached
prompt tokens counted in the engine, in the API's usage and in /metrics.

Greedy answers are compared on questions whose answers do not depend on how the prompt is cut into batches.
llama.cpp's results depend a little on that cut, and reuse changes it (only the suffix is prefilled): with the
demo model, "How early must a cake be ordered?" after this system text is answered one way with the cache off at
``n_batch`` 16, 64 or 256, another way at 91, and with the cache on exactly as with the cache off at ``n_batch``
183, which cuts the prompt where the reused prefix ends. So a near-tie can flip with reuse; nothing else does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from scrape import metric, scrape

from conftest import FleetServer
from llamafleet.engine.prefix import MIN_REUSE
from llamafleet.engine.types import EngineConfig, Generation, Request, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
Chat = list[dict[str, str]]
SYSTEM = ("You are the support assistant of a small bakery. The bakery opens at seven in the morning and closes at "
          "six in the evening, every day except Monday. It sells bread, croissants, cakes made to order, and coffee. "
          "Cakes must be ordered two days ahead. Payment is by card or cash. The bakery is on the main square, next "
          "to the town hall, and there is free parking behind the church. Bread is baked twice a day, at five in the "
          "morning and at noon, so fresh loaves are on the shelves for lunch. Gluten-free bread is baked on Fridays "
          "only. Deliveries are made within the town for orders above twenty euros, between two and four in the "
          "afternoon. Customers with questions the assistant cannot answer should call the shop. Be polite, do not "
          "invent facts, and answer in one short sentence. ")
# answers that stay the same however the prompt is cut into batches (cache off, n_batch 64 to 256)
QUESTIONS = ["Is the bakery open on Monday?", "Is there parking?", "Can I pay by card?", "Who should I call?"]


def engine_cfg(model_path: Path, on: bool) -> EngineConfig:
    return EngineConfig(model_path=str(model_path), n_seq=4, n_ctx_per_seq=512, n_batch=64, prefix_cache=on)


@pytest.fixture(scope="module")
def engines(model_path: Path) -> Iterator[tuple[Engine, Engine]]:
    with Engine(engine_cfg(model_path, True)) as on, Engine(engine_cfg(model_path, False)) as off:
        yield on, off


def chat(question: str, system: str = SYSTEM, before: Chat | None = None) -> Chat:
    return [{"role": "system", "content": system}, *(before or []), {"role": "user", "content": question}]


def both(engines: tuple[Engine, ...], chats: list[Chat]) -> list[list[Generation]]:
    """Run ``chats`` together on each engine (the one with the cache, the one without); answers in input order."""
    results = []
    for eng in engines:
        reqs = [Request(f"q{i}", tuple(eng.tokenize_chat(c)), GREEDY) for i, c in enumerate(chats)]
        got = eng.generate(reqs)
        results.append([got[r.request_id] for r in reqs])
    return results


def test_shared_prefix_burst_repeat_and_next_turn_give_the_same_greedy_answers(
        engines: tuple[Engine, Engine]) -> None:
    on, off = engines
    n_system = len(on.tokenize_chat(chat("")))
    assert n_system > 2 * on.cfg.n_batch  # the first request needs several steps to prefill the shared part
    before = on.stats()
    # a burst: four requests arrive together; the system text is prefilled once and copied to the other three
    cached, plain = both(engines, [chat(q) for q in QUESTIONS])
    assert [c.token_ids for c in cached] == [p.token_ids for p in plain]
    assert cached[0].cached_tokens == 0 and all(c.cached_tokens >= n_system - 8 for c in cached[1:])
    assert all(p.cached_tokens == 0 for p in plain)
    computed = on.stats().prompt_tokens_total - before.prompt_tokens_total
    assert computed < n_system + 4 * 24  # the shared part once, then each question's own tokens
    # the same prompts again (on the cache's engine: the answers to compare with are the plain ones above): each
    # finds its own prompt in a free slot, all but the last token
    again = both((on,), [chat(q) for q in QUESTIONS])[0]
    assert [a.token_ids for a in again] == [p.token_ids for p in plain]
    assert [a.cached_tokens for a in again] == [a.prompt_tokens - 1 for a in again]
    # the next turn: the whole first turn (prompt + answer) comes back, with a new question
    turn2 = [chat("Is the shop open on Sunday?", before=[{"role": "user", "content": q},
                                                        {"role": "assistant", "content": p.text}])
             for q, p in zip(QUESTIONS, plain, strict=True)]
    cached, plain = both(engines, turn2)
    assert [c.token_ids for c in cached] == [p.token_ids for p in plain]
    first_turn = [len(on.tokenize_chat(chat(q))) for q in QUESTIONS]
    assert all(c.cached_tokens >= n for c, n in zip(cached, first_turn, strict=True))
    after = on.stats()
    reused = sum(c.cached_tokens for c in cached)
    assert after.prompt_tokens_cached_total - before.prompt_tokens_cached_total >= reused > 0


def test_a_prefix_held_by_a_running_sequence_is_copied(engines: tuple[Engine, Engine]) -> None:
    """No free slot holds the prefix, a running sequence does: its whole KV stream is copied, then cut."""
    on, off = engines
    system = SYSTEM.replace("bakery", "library")
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    results = []
    for eng in engines:
        eng.add_request(Request("run", tuple(eng.tokenize_chat(chat(QUESTIONS[0], system))), long))
        while not any(o.request_id == "run" for o in eng.step()):
            pass  # its prompt is in the KV and it is generating
        late = Request("late", tuple(eng.tokenize_chat(chat(QUESTIONS[1], system))), GREEDY)
        eng.add_request(late)
        eng.step()
        if eng is on:
            s = next(s for s in eng._running if s.request_id == "late")
            runner = next(s for s in eng._running if s.request_id == "run")
            assert s.slot != runner.slot and s.n_reused >= len(eng.tokenize_chat(chat("", system))) - 8
        got: dict[str, Generation] = {"run": Generation("run"), "late": Generation("late")}
        while eng.has_work():
            for o in eng.step():
                got[o.request_id].add(o)
        results.append(got["late"])
    assert results[0].token_ids == results[1].token_ids
    assert results[0].cached_tokens >= MIN_REUSE and results[1].cached_tokens == 0


def test_a_cancelled_leader_leaves_what_it_computed_to_those_waiting(engines: tuple[Engine, Engine]) -> None:
    """Those waiting for its prefill copy what it had computed when it was cancelled, and compute the rest."""
    on, _ = engines
    system = SYSTEM.replace("bakery", "garage")
    chats = [chat(q, system) for q in QUESTIONS[:3]]
    for i, c in enumerate(chats):
        on.add_request(Request(f"c{i}", tuple(on.tokenize_chat(c)), GREEDY))
    on.step()  # c0 prefills its first chunk; c1 and c2 wait for it
    assert [s.wait_for is not None for s in on._running] == [False, True, True]
    lead = on._running[0]
    on.abort("c0")
    got = {f"c{i}": Generation(f"c{i}") for i in range(3)}
    while on.has_work():
        for o in on.step():
            got[o.request_id].add(o)
    assert got["c0"].finish_reason == "cancelled"
    assert lead.n_cached == lead.n_reused + on.cfg.n_batch  # the chunk it had computed, after what it found
    assert got["c1"].cached_tokens == got["c2"].cached_tokens == lead.n_cached
    # (a KV holding fewer positions than counted would make llama_decode refuse the batch: "error")
    assert all(got[r].finish_reason in ("stop", "length") and got[r].token_ids for r in ("c1", "c2"))
    assert on.stats().slots_busy == 0


def test_the_kv_calls_copy_a_whole_sequence_and_cut_it(model_path: Path) -> None:
    cfg = EngineConfig(model_path=str(model_path), n_seq=2, n_ctx_per_seq=256, n_batch=128, overlap=False)
    with Engine(cfg) as eng:
        eng.generate([Request("a", tuple(range(100, 200)), SamplingParams(max_tokens=1, temperature=0.0))])
        ctx = eng.ctx
        assert ctx.kv_length(0) == 100  # the finished sequence's KV is still in its (free) slot
        ctx.copy_sequence(0, 1)
        assert ctx.kv_length(1) == 100 and ctx.keep_prefix(1, 40) and ctx.kv_length(1) == 40
        assert ctx.kv_length(0) == 100
        assert ctx.keep_prefix(0, 0) and ctx.kv_length(0) == 0


def test_the_server_reports_cached_prompt_tokens_in_usage_and_metrics(fleet: FleetServer) -> None:
    """On the shared server (the prefix routing sends each request to the replica that holds the prompt)."""
    client, model = fleet.client(), fleet.model()
    before = scrape(fleet.url)

    def messages(question: str) -> list[ChatCompletionMessageParam]:
        return [{"role": "system", "content": SYSTEM * 2}, {"role": "user", "content": question}]

    usages = []
    for q in QUESTIONS[:2]:
        r = client.chat.completions.create(model=model, max_tokens=4, temperature=0.0, messages=messages(q))
        usages.append(r.usage)
    stream = client.chat.completions.create(model=model, max_tokens=4, temperature=0.0, messages=messages(
        QUESTIONS[2]), stream=True, stream_options={"include_usage": True})
    usages.append([c.usage for c in stream if c.usage is not None][-1])
    prompt = [u.prompt_tokens for u in usages if u is not None]
    cached = [u.prompt_tokens_details.cached_tokens for u in usages if u and u.prompt_tokens_details]
    assert len(prompt) == len(cached) == 3 and prompt[0] > 200
    assert cached[0] == 0 and all(c is not None and c >= 0.9 * p for c, p in zip(cached[1:], prompt[1:], strict=True))
    text = scrape(fleet.url)

    def grew(name: str) -> float:
        return metric(text, name) - metric(before, name)

    assert grew("llamafleet_prompt_tokens_cached_total") == sum(c or 0 for c in cached)
    assert grew("llamafleet_prompt_tokens_computed_total") == sum(prompt) - sum(c or 0 for c in cached)
