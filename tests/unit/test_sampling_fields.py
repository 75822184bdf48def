"""Every field of ``SamplingParams`` against every mapping of it: each route's request, the relay's upstream request
and what a remote member can serve. A field added to ``SamplingParams`` and forgotten in one of them fails here."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
from pydantic import BaseModel

from llamafleet.api.anthropic_requests import MessagesRequest
from llamafleet.api.infill import InfillRequest
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.api.protocol import GenerateRequest
from llamafleet.api.responses_requests import ResponsesRequest
from llamafleet.engine.types import LLAMA_CPP_KNOBS, OPENAI_KNOBS, SamplingParams
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.relay import RemoteMember, upstream_request
from llamafleet.fleet.remote import unrelayable

DEFAULTS = SamplingParams()
NAMES = [f.name for f in fields(SamplingParams)]
# one value per field, unlike its default; a new field needs one here (the first test says so)
NON_DEFAULT: dict[str, Any] = {
    "max_tokens": 7, "temperature": 0.5, "top_k": 5, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.7,
    "repeat_penalty": 1.3,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "penalty_last_n": 16, "seed": 3, "stop": ("x",),
    "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "prompt_logprobs": True, "grammar": 'root ::= "a"',
    "logit_bias": ((5, 2.0),), "think_budget": 3, "speculative": False, "lora": (("a", 1.0),),
}
NEEDS: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}}  # what a value needs beside it
WIRE: dict[str, Any] = {"stop": ["x"], "logit_bias": {"5": 2.0}}  # the JSON of a value, where it differs
# set by the service from the model's adapters (the name MODEL:ADAPTER, llama-server's lora list), not by a route
BY_SERVICE = {"lora"}
NOT_RELAYED = {"speculative"}  # how an answer is computed, not what: a remote member speculates as it is set up to
LLAMA = RemoteMember(url="http://llama", model=None)
PROVIDER = RemoteMember(url="https://provider", model="m", llama_cpp=False)


def params_with(name: str) -> SamplingParams:
    return SamplingParams(**NEEDS.get(name, {}), **{name: NON_DEFAULT[name]})


def test_every_field_has_a_value_unlike_its_default_here() -> None:
    assert sorted(NON_DEFAULT) == sorted(NAMES), "give the new SamplingParams field a value in NON_DEFAULT"
    for name in NAMES:
        assert getattr(params_with(name), name) != getattr(DEFAULTS, name), name
    assert set(OPENAI_KNOBS) | set(LLAMA_CPP_KNOBS) <= set(NAMES)


# -- the routes ----------------------------------------------------------------------------------------------------
def chat(body: dict[str, Any]) -> SamplingParams:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    return req.sampling(req.token_limit(), 0, req.logprobs)


def completion(body: dict[str, Any]) -> SamplingParams:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "hi", **body})
    return req.sampling(req.max_tokens, 0, req.logprobs is not None, req.scores_prompt("hi"))


def messages(body: dict[str, Any]) -> SamplingParams:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 100,
                                           "messages": [{"role": "user", "content": "hi"}], **body}).sampling()


def responses(body: dict[str, Any]) -> SamplingParams:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **body}).sampling()


def generate(body: dict[str, Any]) -> SamplingParams:
    return GenerateRequest.model_validate({"prompt": "hi", **body}).sampling()


def infill(body: dict[str, Any]) -> SamplingParams:
    return InfillRequest.model_validate({"input_prefix": "a", "input_suffix": "b", **body}).sampling()


ROUTES = {"chat": (chat, ChatCompletionRequest), "completions": (completion, CompletionRequest),
          "messages": (messages, MessagesRequest), "responses": (responses, ResponsesRequest),
          "generate": (generate, GenerateRequest), "infill": (infill, InfillRequest)}
OWN_DEFAULTS = {("infill", "temperature"), ("infill", "top_p")}  # llama-server's, which its editor plugins expect
# OpenAI's bodies for the fields whose parameter is shaped differently, per route (None: the route cannot set it)
OPENAI_SHAPES: dict[str, dict[str, dict[str, Any] | None]] = {
    "chat": {"logprobs": {"logprobs": True}, "top_logprobs": {"logprobs": True, "top_logprobs": 2},
             "prompt_logprobs": None, "think_budget": {"reasoning_budget": 3}, "penalty_last_n": {"repeat_last_n": 16}},
    "completions": {"logprobs": {"logprobs": 0}, "top_logprobs": {"logprobs": 2},
                    "prompt_logprobs": {"echo": True, "logprobs": 0}, "think_budget": None,
                    "penalty_last_n": {"repeat_last_n": 16}},
}


def body_of(name: str) -> dict[str, Any]:
    return {name: WIRE.get(name, NON_DEFAULT[name])}


def test_the_openai_routes_set_every_field() -> None:
    for name in set(NAMES) - BY_SERVICE:
        routes = [r for r in OPENAI_SHAPES if OPENAI_SHAPES[r].get(name, {}) is not None]
        assert routes, f"no OpenAI route sets {name}"
        for route in routes:
            body = OPENAI_SHAPES[route].get(name) or body_of(name)
            assert getattr(ROUTES[route][0](body), name) == NON_DEFAULT[name], f"{route} does not set {name}"


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_routes_parameter_named_as_a_field_reaches_it_and_the_rest_start_from_the_defaults(route: str) -> None:
    to_params, model = ROUTES[route]
    named = [n for n in NAMES if n in model.model_fields and n not in {*OPENAI_SHAPES.get(route, {}), *BY_SERVICE}]
    assert named, route
    for name in named:
        assert getattr(to_params(body_of(name)), name) == NON_DEFAULT[name], f"{route} drops {name}"
    plain = to_params({})
    taken = {n for n in NAMES if n in model.model_fields} | BY_SERVICE
    for name in set(NAMES) - taken - {"max_tokens"}:
        assert getattr(plain, name) == getattr(DEFAULTS, name), f"{route}'s {name} does not start at the default"
    for name in taken & set(OPENAI_KNOBS + LLAMA_CPP_KNOBS) - {n for r, n in OWN_DEFAULTS if r == route}:
        assert model.model_fields[name].default == getattr(DEFAULTS, name), f"{route} has a default of its own"


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_routes_defaults_can_be_relayed_to_any_member(route: str) -> None:
    to_params, _ = ROUTES[route]
    for member in (LLAMA, PROVIDER):
        assert unrelayable(Submit("r", to_params({}), prompt="hi"), member) is None


# -- the relay and remote members ----------------------------------------------------------------------------------
def upstream_params(p: SamplingParams, member: RemoteMember, chat_form: bool) -> SamplingParams | None:
    """What a llamafleet upstream samples with for ``p`` relayed to it; None when the member refuses it."""
    msg = Submit("r", p, chat=(("user", "hi"),)) if chat_form else Submit("r", p, prompt="hi")
    if unrelayable(msg, member) is not None:
        return None
    path, body = upstream_request(msg, member, "m")
    model: type[BaseModel] = ChatCompletionRequest if chat_form else CompletionRequest
    req = model.model_validate(body)
    if isinstance(req, ChatCompletionRequest):
        return req.sampling(req.token_limit(), 0, req.logprobs)
    assert isinstance(req, CompletionRequest)
    return req.sampling(req.max_tokens, 0, req.logprobs is not None, req.scores_prompt("hi"))


@pytest.mark.parametrize("chat_form", [True, False])
def test_a_relayed_field_samples_the_same_upstream_or_is_refused(chat_form: bool) -> None:
    for name in NAMES:
        if name in NOT_RELAYED:
            continue
        p = params_with(name)
        for member in (LLAMA, PROVIDER):
            got = upstream_params(p, member, chat_form)
            if got is None:
                continue
            got = got if p.max_tokens is not None else replace(got, max_tokens=None)  # completions' default: 16
            assert got == p, f"{name} does not cross to {member.url}"
        if name in (*LLAMA_CPP_KNOBS, "penalty_last_n"):
            assert name in (unrelayable(Submit("r", p, prompt="hi"), PROVIDER) or ""), name
