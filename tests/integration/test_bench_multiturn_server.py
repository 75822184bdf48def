"""``llamafleet bench multiturn`` against the real server (the session's ``fleet``): the report's per-turn rows,
later turns re-sending the answers the server really gave, and conversations run a given number at a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import FleetServer
from llamafleet import cli
from llamafleet.bench import multiturn

MAX_TOKENS = 4
SYSTEM_WORDS = 24
USER_WORDS = 6


def replay(root: Path, url: str, *extra: str) -> dict[str, Any]:
    rc = cli.main(["bench", "multiturn", "--url", url, "--system-tokens", str(SYSTEM_WORDS), "--user-tokens",
                   str(USER_WORDS), "--max-tokens", str(MAX_TOKENS), "--no-progress", "--out", str(root), *extra])
    if not (root / "bench.json").exists():
        pytest.fail(f"bench multiturn exited with {rc} and wrote no report; its error is in the captured stderr")
    assert rc == 0
    report: dict[str, Any] = json.loads((root / "bench.json").read_text())
    return report


def check_rows(rep: dict[str, Any], conversations: int, turns: int) -> None:
    assert [t["turn"] for t in rep["turns"]] == list(range(1, turns + 1)) and rep["overall"]["turn"] == "all"
    for row in rep["turns"]:
        assert (row["requests"], row["ok"], row["errors"]) == (conversations, conversations, 0), row["error_samples"]
        assert row["output_tokens"] == MAX_TOKENS * conversations and row["finished_early"] == 0
        assert row["usage_reported"] == conversations
        assert 0 < row["ttft_ms"]["p50"] <= row["ttft_ms"]["p99"] <= row["e2e_ms"]["p99"]
        assert row["output_tok_s"] > 0 and 0 < row["span_s"] <= rep["wall_s"]
        # the server's own usage decides the hit rate: a number when it reports cached tokens, n/a when not
        if row["cache_reported"]:
            assert row["cache_hit"] == pytest.approx(row["cached_tokens"] / row["prompt_tokens"])
        else:
            assert row["cache_hit"] is None and row["cached_tokens"] is None
    assert rep["overall"]["requests"] == conversations * turns and rep["not_sent"] == 0


def test_completions_replay_report(fleet: FleetServer, tmp_path: Path) -> None:
    rep = replay(tmp_path, fleet.url, "--conversations", "3", "--turns", "2", "--seed", "11")
    assert rep["schema"] == "llamafleet.bench.multiturn/1" and rep["config"]["endpoint"] == "/v1/completions"
    assert rep["config"]["concurrency"] == 3 and rep["config"]["seed"] == 11
    check_rows(rep, conversations=3, turns=2)
    one, two = rep["turns"]
    # turn 2 re-sends turn 1's prompt and answer plus a new user line: the server counts that many more tokens
    assert two["prompt_tokens_mean"] >= one["prompt_tokens_mean"] + USER_WORDS + MAX_TOKENS - 1
    first, second = rep["sample"]
    assert first["answer"] and second["prompt"].startswith(first["prompt"] + first["answer"] + "\nUser: ")
    assert first["prompt"].startswith("System: ") and len(first["prompt"].split("\n")[0].split()) == SYSTEM_WORDS + 1
    md = (tmp_path / "bench.md").read_text()
    assert md.count("\n| ") == 4  # header + turns 1, 2 and all
    assert ("n/a" in md) == (rep["overall"]["cache_reported"] == 0)


def test_chat_replay_resends_the_servers_answers(fleet: FleetServer, tmp_path: Path) -> None:
    rep = replay(tmp_path, fleet.url, "--chat", "--conversations", "2", "--turns", "2", "--concurrency", "1")
    assert rep["config"]["endpoint"] == "/v1/chat/completions" and rep["config"]["concurrency"] == 1
    check_rows(rep, conversations=2, turns=2)
    first, second = rep["sample"]
    # asked again alone, as it was (one conversation at a time), the first turn gets the same greedy answer
    again = fleet.client().chat.completions.create(model=fleet.model(), messages=first["prompt"], temperature=0,
                                                   max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == first["answer"] != ""
    assert second["prompt"][:len(first["prompt"])] == first["prompt"]
    assert second["prompt"][len(first["prompt"])] == {"role": "assistant", "content": first["answer"]}
    assert second["prompt"][-1]["role"] == "user" and len(second["prompt"][-1]["content"].split()) == USER_WORDS


def test_shared_prefix_users_a_given_number_at_a_time(fleet: FleetServer) -> None:
    cfg = multiturn.MultiTurnConfig(url=fleet.url, model=fleet.model(), conversations=3, turns=1,
                                    system_tokens=SYSTEM_WORDS, user_tokens=USER_WORDS, max_tokens=MAX_TOKENS,
                                    concurrency=2, seed=3)
    run = multiturn.run(cfg, progress=False)
    assert [len(c.turns) for c in run.conversations] == [1, 1, 1] and all(r.ok for r in run.results())
    prompts = [c.turns[0].prompt for c in run.conversations]
    assert all(isinstance(p, str) for p in prompts)
    system = {str(p).split("\n")[0] for p in prompts}
    assert len(system) == 1  # one system prompt for all users, then each user's own line
    assert len({str(p).split("\n")[1] for p in prompts}) == 3
    # two workers: the third user starts only when one of the first two has its answer
    ends = sorted(r.sent_at + r.latency for r in run.results()[:2])
    assert run.results()[2].sent_at >= ends[0]


def test_private_contexts_turn_by_turn(fleet: FleetServer) -> None:
    """--private-tokens gives each conversation a context of its own; --by-turn sends every conversation's turn
    before any conversation's next one."""
    cfg = multiturn.MultiTurnConfig(url=fleet.url, model=fleet.model(), conversations=3, turns=2, system_tokens=8,
                                    private_tokens=16, user_tokens=USER_WORDS, max_tokens=MAX_TOKENS,
                                    concurrency=2, seed=5, by_turn=True)
    run = multiturn.run(cfg, progress=False)
    assert all(r.ok for r in run.results()) and len(run.results()) == 6
    systems = [c.system for c in run.conversations]
    assert len(set(systems)) == 3 and len({s.split("\n\n")[0] for s in systems}) == 1  # shared, then its own
    assert all(len(s.split("\n\n")[1].split()) == 16 for s in systems)
    turn1_end = max(r.sent_at + r.latency for r in run.results(0))
    assert min(r.sent_at for r in run.results(1)) >= turn1_end


def test_a_deadline_stops_sending_and_reports_the_rest_as_not_sent(fleet: FleetServer, tmp_path: Path) -> None:
    args = ("--conversations", "2", "--turns", "2", "--concurrency", "1", "--seed", "9", "--by-turn")
    rep = replay(tmp_path / "late", fleet.url, *args, "--deadline", "600")
    assert rep["not_sent"] == 0 and rep["config"]["deadline_s"] == 600
    past = replay(tmp_path / "past", fleet.url, *args, "--deadline", "0.000001")  # over before the first turn
    assert past["not_sent"] == 4 and past["overall"]["requests"] == 0
    assert "the replay's deadline of 1e-06 s passed" in (tmp_path / "past" / "bench.md").read_text()
