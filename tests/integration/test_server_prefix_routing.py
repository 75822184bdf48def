"""Prefix-aware routing (the default policy) on the shared 2-replica server: a conversation's turns stay on the replica
that holds its history, unrelated requests still spread over both, and /metrics says why each sequence went where it
went. On a server of its own (one slot per replica, no RAM tier, a disk tier): the router counts what the engines
report their KV holds, not what it sent (a session whose slot was given up and spilled to the shared disk tier counts
for both replicas, and the other one restores it)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam
from scrape import metric, scrape

from conftest import FleetServer

HEADER = "x-llamafleet-replicas"
SYSTEM = ("You are the help desk of a small hardware shop. Answer in one short sentence, name the tool to use, and "
          "never recommend a brand. If the question is not about tools, say that you only know about tools. ") * 2


@pytest.fixture(scope="module")
def spilling(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
             tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    """One slot per replica, no park or RAM tier: a slot's KV, when the slot is taken, goes to the shared disk tier."""
    cache = tmp_path_factory.mktemp("kv")
    s = launch_fleet(["--model", str(model_path), "--replicas", "2", "--parallel", "1", "--ctx", "1024",
                      "--threads", "1", "--routing", "prefix", "--cache-ram", "0", "--cache-dir", str(cache)])
    s.wait_ready()
    return s


def test_a_conversations_turns_stay_on_one_replica(fleet: FleetServer) -> None:
    client, model = fleet.client(), fleet.model()
    before = scrape(fleet.url)
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    placed = []
    for question in ("Which screwdriver fits a cross-head screw?", "And for a hexagonal socket?",
                     "What do I use to cut copper pipe?", "How do I tighten the fitting afterwards?"):
        messages.append({"role": "user", "content": question})
        raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=12,
                                                               temperature=0)
        placed.append(int(raw.headers[HEADER]))
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    # one request at a time on idle replicas: least_outstanding would alternate 0, 1, 0, 1
    assert len(set(placed)) == 1, placed
    after = scrape(fleet.url)
    for reason, grew in (("prefix", 3), ("load", 1)):
        assert (metric(after, "llamafleet_routing_decisions_total", reason=reason)
                - metric(before, "llamafleet_routing_decisions_total", reason=reason)) == grew


def test_unrelated_requests_still_spread_over_both_replicas(fleet: FleetServer) -> None:
    client, model = fleet.client(), fleet.model()

    def ask(i: int) -> int:
        prompt = f"Request {i}. " + "Write a list of things a person might keep in a kitchen drawer. " * 5
        raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        return int(raw.headers[HEADER])

    assert [ask(i) for i in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])  # one at a time: they take turns
    with ThreadPoolExecutor(8) as pool:
        placed = list(pool.map(ask, range(4, 12)))
    assert set(placed) == {0, 1}


def test_a_session_spilled_to_disk_by_one_replica_counts_for_both_and_the_other_restores_it(
        spilling: FleetServer) -> None:
    client, model = spilling.client(), spilling.model()
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM * 3},
                                                  {"role": "user", "content": "Which screwdriver fits a cross-head?"}]

    def ask(msgs: list[ChatCompletionMessageParam]) -> tuple[int, int, str]:
        raw = client.chat.completions.with_raw_response.create(model=model, messages=msgs, max_tokens=8,
                                                               temperature=0)
        answer = raw.parse()
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return (int(raw.headers[HEADER]), answer.usage.prompt_tokens_details.cached_tokens or 0,
                answer.choices[0].message.content or "")

    holder, _, text = ask(messages)
    # two unrelated prompts, one at a time: idle replicas take turns, so one of them takes the holder's only slot,
    # whose KV (the session's) goes to the disk tier the two replicas share
    placed = [ask([{"role": "user", "content": f"Request {i}. " + "List what a kitchen drawer holds. " * 12}])[0]
              for i in range(2)]
    assert holder in placed, placed
    before = scrape(spilling.url)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And for a hexagonal socket?"}]
    replica, cached, _ = ask(messages)
    after = scrape(spilling.url)
    # both replicas hold the session's prefix only on disk: a tie, so the replica whose turn it is takes it (the
    # last unrelated prompt went to the holder, so it is the other one's turn); guessing from what was sent would
    # have sent it to the holder, whose slot no longer has it
    assert placed[-1] == holder and replica != holder
    assert (metric(after, "llamafleet_routing_decisions_total", reason="prefix")
            - metric(before, "llamafleet_routing_decisions_total", reason="prefix")) == 1
    assert cached >= 200  # the other replica restored the system prompt and turn 1 from the holder's file
