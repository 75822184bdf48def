"""Prefix-aware routing (the default policy) on the shared 2-replica server: a conversation's turns stay on the replica
that holds its history, unrelated requests still spread over both, and /metrics says why each sequence went where it
went."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from openai.types.chat import ChatCompletionMessageParam
from scrape import metric, scrape

from conftest import FleetServer

HEADER = "x-llamafleet-replicas"
SYSTEM = ("You are the help desk of a small hardware shop. Answer in one short sentence, name the tool to use, and "
          "never recommend a brand. If the question is not about tools, say that you only know about tools. ") * 2


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
