"""Continuous-batching schedule under a token budget (pure logic)."""

from collections.abc import Callable

from llamafleet.engine.scheduler import AGING_PASSES, Shares, Waiting, schedule
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import PriorityConfig, Request


def seq(rid: str, prompt_len: int, cached: int = 0, generated: int = 0, priority: int = 1) -> Sequence:
    s = Sequence(Request(rid, tuple(range(1, prompt_len + 1)), priority=priority), slot=0, chain=None)
    s.tokens += [7] * generated
    s.n_cached = cached
    return s


def test_decodes_go_first_then_prompt_chunks_fill_the_budget() -> None:
    a = seq("a", 10, cached=12, generated=3)  # generating: 1 pending token
    b = seq("b", 100)  # new prompt
    c = seq("c", 50)
    plan = schedule([b, a, c], budget=64)
    assert [(s.request_id, n) for s, n in plan] == [("a", 1), ("b", 63)]


def test_long_prompt_is_prefilled_over_several_steps() -> None:
    b = seq("b", 300)
    steps = []
    while b.pending > 0:
        (s, n), = schedule([b], budget=128)
        steps.append(n)
        b.n_cached += n
    assert steps == [128, 128, 44]  # the last chunk ends with the token whose logits give the first answer token


def test_rotation_prevents_starvation_when_budget_is_smaller_than_decodes() -> None:
    seqs = [seq(str(i), 4, cached=4, generated=1) for i in range(5)]
    seen = set()
    for step in range(5):
        seen |= {s.request_id for s, _ in schedule(seqs, budget=2, rotate=step)}
    assert seen == {"0", "1", "2", "3", "4"}


def test_plan_is_in_slot_order_for_llamas_consecutive_micro_batches() -> None:
    seqs = []
    for rid, slot in (("a", 5), ("b", 2), ("c", 7), ("d", 3)):
        s = seq(rid, 4, cached=4, generated=1)
        s.slot = slot
        seqs.append(s)
    new = seq("e", 30)
    new.slot = 4
    plan = schedule([*seqs, new], budget=64)
    assert [s.slot for s, _ in plan] == [2, 3, 4, 5, 7]
    assert dict((s.request_id, n) for s, n in plan)["e"] == 30


def test_prefill_budget_is_kept_for_prompts_however_many_answers_run() -> None:
    running = [seq(f"d{i}", 4, cached=4, generated=1) for i in range(100)]  # 100 answers, 1 token each
    prompts = [seq("p", 300), seq("q", 300)]
    plan = schedule(running + prompts, budget=2048, prefill_budget=512)
    assert sum(n for s, n in plan if s.request_id.startswith("d")) == 100  # every running answer advances
    assert [(s.request_id, n) for s, n in plan if not s.request_id.startswith("d")] == [("p", 300), ("q", 212)]
    # without a prefill budget the running answers eat into the prompts' share of the step
    plan = schedule(running + prompts, budget=512)
    assert sum(n for s, n in plan if not s.request_id.startswith("d")) == 412


def test_a_second_prompt_joins_a_pass_only_while_its_tokens_cost_less_than_the_pass_itself() -> None:
    a = seq("a", 10, cached=12, generated=3)  # generating
    b, c, d = seq("b", 40), seq("c", 40), seq("d", 8)
    ids = lambda plan: [(s.request_id, n) for s, n in plan]  # noqa: E731
    assert ids(schedule([a, b, c, d], budget=512)) == [("a", 1), ("b", 40), ("c", 40), ("d", 8)]  # unmeasured
    # a CPU: a pass's fixed cost is worth ~2 tokens: prompts arriving together go one after the other, oldest first
    assert ids(schedule([a, b, c, d], budget=512, join_tokens=2.0)) == [("a", 1), ("b", 40)]
    assert ids(schedule([a, b, c], budget=512, join_tokens=39.0)) == [("a", 1), ("b", 40)]  # 1 x 40 > 1 x 39
    # a GPU: the fixed cost pays for 64 tokens: small prompts share the pass
    assert ids(schedule([a, b, c, d], budget=512, join_tokens=64.0)) == [("a", 1), ("b", 40), ("c", 40), ("d", 8)]
    assert ids(schedule([b], budget=512, join_tokens=0.0)) == [("b", 40)]  # the first prompt always goes
    # a burst: each joining chunk spares the many behind it a pass, so they fill the pass up to its budget
    burst = [seq(str(i), 128) for i in range(64)]
    assert len(schedule(burst, budget=512, join_tokens=8.0)) == 4


def _flood_beside(chat: Sequence) -> list[Sequence]:
    """A batch prompt admitted before ``chat``, three batch answers running, then ``chat``: in slot order."""
    batch = [seq("bp", 10, priority=2)] + [seq(f"bd{i}", 10, cached=12, generated=3, priority=2) for i in range(3)]
    for i, s in enumerate([*batch, chat]):
        s.slot = i
    return [*batch, chat]


def ids(plan: list[tuple[Sequence, int]]) -> list[tuple[str, int]]:
    return [(s.request_id, n) for s, n in plan]


def test_beside_a_better_prompt_batch_work_takes_its_share_of_the_pass_and_batch_prompts_yield() -> None:
    running = _flood_beside(seq("chat", 12, priority=0))
    # a CPU (a pass's fixed cost worth 2 tokens): 10% of a 12-token prompt's pass is one token: one batch answer
    # advances, the older batch prompt waits; without the rule the chat prompt waited for it and shared every pass
    assert ids(schedule(running, 2048, 0, 512, join_tokens=2.0, shares=Shares(0.1, None))) == [("bd0", 1), ("chat", 12)]
    assert ids(schedule(running, 2048, 0, 512, join_tokens=2.0)) == [("bp", 10), ("bd0", 1), ("bd1", 1), ("bd2", 1)]
    # a GPU (the fixed cost worth 500 tokens): 10% of the pass pays for all of the batch work; the chat prompt first
    plan = schedule(running, 2048, 0, 512, join_tokens=500.0, shares=Shares(0.1, None))
    assert sorted(ids(plan)) == [("bd0", 1), ("bd1", 1), ("bd2", 1), ("bp", 10), ("chat", 12)]
    # a CPU whose pass costs its tokens alone: 10% of 9 tokens is none, and the chat's prompt ends in this pass
    short = _flood_beside(seq("chat", 9, priority=0))
    assert ids(schedule(short, 2048, 0, 512, join_tokens=0.0, shares=Shares(0.1, None))) == [("chat", 9)]
    # unmeasured passes (or tokens that cost nothing): no limit, every prompt joins
    assert len(schedule(running, 2048, 0, 512, join_tokens=None, shares=Shares(0.1, None))) == 5


def test_batch_answers_beside_a_long_better_prompt_take_turns_and_never_stop() -> None:
    running = _flood_beside(seq("chat", 900, priority=0))[1:]  # prefilled over several passes
    turns = [ids(schedule(running, 2048, step, 512, join_tokens=2.0, shares=Shares(0.0, None))) for step in range(3)]
    assert turns == [[("bd0", 1), ("chat", 512)], [("bd1", 1), ("chat", 512)], [("bd2", 1), ("chat", 512)]]
    running[-1].n_cached, running[-1].tokens = 900, running[-1].tokens + [7]  # it answers: no limit on its passes
    assert len(schedule(running, 2048, 0, 512, join_tokens=2.0, shares=Shares(0.0, None))) == 4


def test_while_better_work_is_about_batch_prompts_go_in_short_passes() -> None:
    running = _flood_beside(seq("chat", 12, priority=0))[:4]  # the better request has not come yet, or has gone
    about = Shares(0.1, 0.1)
    # a CPU (a pass's fixed cost worth 0.45 tokens): 5 tokens make it 10% of the pass: the 3 answers and 2 prompt tokens
    assert ids(schedule(running, 2048, 0, 512, join_tokens=0.45, shares=about)) == [
        ("bp", 2), ("bd0", 1), ("bd1", 1), ("bd2", 1)]
    assert ids(schedule(running, 2048, 0, 512, join_tokens=0.0, shares=about))[0] == ("bp", 1)  # at least one token
    # a GPU: the fixed cost pays for all of it; better work no longer about, or the rule off (0): no limit
    for join, alone in ((500.0, 0.1), (0.45, None), (0.45, 0.0)):
        assert ids(schedule(running, 2048, 0, 512, join, Shares(0.1, alone)))[0] == ("bp", 10)


def test_with_one_class_the_batch_rule_changes_nothing() -> None:
    for priority in (1, 2):  # no batch work, or only batch work and no better work about
        running = [seq("p", 40, priority=priority)] + [seq(f"d{i}", 10, cached=12, generated=3, priority=priority)
                                                       for i in range(3)]
        for join in (None, 2.0, 500.0):
            plain = ids(schedule(running, 2048, 1, 512, join))
            assert ids(schedule(running, 2048, 1, 512, join, Shares(0.0, None if priority == 2 else 0.0))) == plain


def _waiting(*reqs: tuple[str, int, str], clock: Callable[[], float] = lambda: 0.0) -> Waiting:
    w = Waiting(4, clock)
    for rid, priority, tenant in reqs:
        w.append(Request(rid, (1, 2, 3), priority=priority, tenant=tenant))
    return w


def _running(*tenants: str) -> list[Sequence]:
    return [Sequence(Request(f"r{i}", (1,), tenant=t), slot=i, chain=None) for i, t in enumerate(tenants)]


def test_admission_is_first_come_first_served_without_priorities_or_tenants() -> None:
    w = _waiting(*((str(i), 1, "") for i in range(5)))
    assert [w.pop([], 4).request_id for _ in range(5)] == ["0", "1", "2", "3", "4"]


def test_a_better_class_is_admitted_first() -> None:
    w = _waiting(("b1", 2, "bulk"), ("b2", 2, "bulk"), ("d", 1, "x"), ("i", 0, "chat"))
    assert [w.pop([], 4).request_id for _ in range(4)] == ["i", "d", "b1", "b2"]


def test_within_a_class_the_tenant_holding_fewest_slots_goes_first() -> None:
    w = _waiting(*((f"a{i}", 1, "a") for i in range(100)), ("lone", 1, "b"))
    assert w.pop(_running("a", "a", "a"), 1).request_id == "lone"  # the next slot that frees is the lone key's
    w = _waiting(*((f"a{i}", 1, "a") for i in range(3)), ("b0", 1, "b"), ("b1", 1, "b"))
    order, running = [], _running()
    for _ in range(5):
        req = w.pop(running, 4)
        order.append(req.request_id)
        running.append(Sequence(req, slot=len(running), chain=None))
    assert order == ["a0", "b0", "a1", "b1", "a2"]  # turns, oldest first among equals


def test_aging_admits_a_lower_class_within_a_bounded_number_of_admissions() -> None:
    w = _waiting(("batch", 2, "bulk"))
    admitted = []
    for i in range(4 * AGING_PASSES):
        w.append(Request(f"i{i}", (1,), priority=0, tenant="chat"))  # interactive work never stops coming
        admitted.append(w.pop([], 4).request_id)
    assert "batch" in admitted and admitted.index("batch") <= 2 * AGING_PASSES
    assert len(w) == 1 and w.remove("nope") is None


def test_a_batch_flood_does_not_age_whole_and_take_the_kept_slot() -> None:
    w = _waiting(*((f"b{i}", 2, "bulk") for i in range(200)))
    admitted = []
    for i in range(3 * AGING_PASSES):  # an interactive request every so often, and batch answers ending between
        w.append(Request(f"i{i}", (1,), priority=0, tenant="chat"))
        admitted += [w.pop([], 2).request_id, w.pop([], 2).request_id]  # the interactive one, then one batch
        assert w.pop([], 1) is None  # the last free slot stays kept (every waiting request aged: b... took it)
    assert admitted[:4] == ["i0", "b0", "i1", "b1"]
    # batch work got its slots all along, so none of it aged past the oldest: the flood is still batch
    assert sum(e.startswith("b") for e in admitted) == 3 * AGING_PASSES


def _next(w: Waiting, free: int) -> str | None:
    req = w.pop([], free)
    return None if req is None else req.request_id


def test_batch_work_leaves_the_last_free_slot_while_better_work_is_about() -> None:
    now = [0.0]
    w = _waiting(("b0", 2, "bulk"), ("b1", 2, "bulk"), clock=lambda: now[0])
    assert [_next(w, 2), _next(w, 1)] == ["b0", "b1"]  # no better work seen: every slot
    w.append(Request("i", (1,), priority=0, tenant="chat"))
    w.append(Request("b2", (1,), priority=2, tenant="bulk"))
    w.append(Request("b3", (1,), priority=2, tenant="bulk"))
    assert w.shares() == Shares(PriorityConfig.batch_share, PriorityConfig.batch_alone_cost)
    assert [_next(w, 1), _next(w, 2), _next(w, 1)] == ["i", "b2", None]  # two free: one for batch; the last kept
    now[0] += PriorityConfig.reserve_s + 1
    assert _next(w, 1) == "b3"  # better work has gone quiet: the last slot is batch's too
    assert w.shares() == Shares(PriorityConfig.batch_share, None)  # (and batch work alone is no longer limited)
    assert Waiting(4, priorities=PriorityConfig(batch_share=None)).shares() is None
    single = Waiting(1, lambda: 0.0)  # one slot: nothing can be kept
    single.append(Request("i", (1,), priority=0))
    single.append(Request("b", (1,), priority=2))
    assert [_next(single, 1), _next(single, 1)] == ["i", "b"]
