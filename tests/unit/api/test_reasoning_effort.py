"""A reasoning effort (chat's ``reasoning_effort``, Responses' ``reasoning.effort``) is a reasoning budget: its share of
the answer's token limit (of the context without one) for a model that thinks, given to the template as well; a
template that takes the effort itself (gpt-oss) gets it alone; an explicit budget wins; an unknown effort is a 400."""

from __future__ import annotations

from typing import Any

import pytest

from llamafleet.api.anthropic_requests import MessagesRequest
from llamafleet.api.errors import ApiError
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.responses_requests import ResponsesRequest
from llamafleet.api.tools import EFFORTS, Serving
from llamafleet.engine.families import FAMILIES
from llamafleet.engine.template import ChatTemplate
from llamafleet.model.synth import vendored

MESSAGES = [{"role": "user", "content": "Hi"}]


def _chat(family: str | None, context: int = 4096, **fields: Any) -> ChatCompletionRequest:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **fields})
    req.served_by(Serving(None if family is None else FAMILIES[family], context=context))
    return req


@pytest.mark.parametrize(("effort", "budget"), [("none", 1), ("minimal", 20), ("low", 40), ("medium", 100),
                                                ("high", 160), ("xhigh", 190), ("max", 190)])
def test_an_effort_is_its_share_of_the_token_limit(effort: str, budget: int) -> None:
    req = _chat("qwen3", reasoning_effort=effort, max_tokens=200)
    assert req.think_budget() == budget and req.sampling(200, 0, False).think_budget == budget
    kwargs = req.template_kwargs(None, effort, "chat_template_kwargs")
    assert kwargs["reasoning_effort"] == effort and kwargs.get("enable_thinking", True) == (effort != "none")


def test_without_a_token_limit_the_share_is_of_the_context() -> None:
    assert _chat("deepseek-r1", 1000, reasoning_effort="low").think_budget() == 200
    assert _chat("magistral", 1000, reasoning_effort="high", max_completion_tokens=10).think_budget() == 8


def test_an_explicit_budget_wins_and_models_that_do_not_budget_by_effort_get_none() -> None:
    assert _chat("qwen3", reasoning_effort="high", reasoning_budget=7, max_tokens=100).think_budget() == 7
    assert _chat("gpt-oss", reasoning_effort="low", max_tokens=100).think_budget() is None  # its template's own
    assert _chat("llama3", reasoning_effort="low", max_tokens=100).think_budget() is None  # it does not think
    assert _chat(None, reasoning_effort="low", max_tokens=100).think_budget() is None


@pytest.mark.parametrize("effort", ["extreme", "High", ""])
def test_an_unknown_effort_is_a_400_naming_it(effort: str) -> None:
    with pytest.raises(ApiError) as e:
        _chat("qwen3", reasoning_effort=effort, max_tokens=100).think_budget()
    assert e.value.param == "reasoning_effort" and all(name in str(e.value) for name in EFFORTS)
    req = ResponsesRequest.model_validate({"model": "m", "input": "Hi", "reasoning": {"effort": effort}})
    req.served_by(Serving(FAMILIES["qwen3"], context=4096))
    with pytest.raises(ApiError) as e:
        req.sampling()
    assert e.value.param == "reasoning.effort"


def test_responses_reasoning_effort_is_the_same_budget() -> None:
    req = ResponsesRequest.model_validate({"model": "m", "input": "Hi", "max_output_tokens": 50,
                                           "reasoning": {"effort": "medium"}})
    req.served_by(Serving(FAMILIES["glm"], context=4096))
    assert req.sampling().think_budget == 25


def test_thinking_is_switched_off_by_the_familys_own_variable() -> None:
    """``"none"`` (and Messages' ``thinking.type``) set ``enable_thinking``, or MiniMax M3's ``thinking_mode``, whose
    ``"enabled"`` makes its template open the think block."""
    assert _chat("minimax-m3").template_kwargs(None, "none", "p") == {"reasoning_effort": "none",
                                                                      "thinking_mode": "disabled"}
    assert _chat("minimax-m3").template_kwargs(None, None, "p", True) == {"thinking_mode": "enabled"}
    assert _chat(None).template_kwargs({"enable_thinking": True}, "none", "p")["enable_thinking"] is True
    source = vendored("models/templates/MiniMax-M3.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(source, "", "", False)
    assert template.render(MESSAGES, kwargs=[("thinking_mode", "enabled")]).endswith("<mm:think>")
    assert template.render(MESSAGES, kwargs=[("thinking_mode", "disabled")]).endswith("</mm:think>")


@pytest.mark.parametrize(("family", "effort", "level"), [
    ("gpt-oss", "minimal", "low"), ("gpt-oss", "medium", "medium"), ("gpt-oss", "xhigh", "high"),
    ("hy3", "none", "no_think"), ("hy3", "low", "low"), ("hy3", "medium", "high")])
def test_a_template_with_its_own_levels_gets_the_nearest(family: str, effort: str, level: str) -> None:
    """gpt-oss's template knows low, medium and high, Hunyuan 3's no_think, low and high (it refuses others): each
    gets its own level, and no budget."""
    req = _chat(family, reasoning_effort=effort, max_tokens=100)
    assert req.template_kwargs(None, effort, "p")["reasoning_effort"] == level and req.think_budget() is None


def test_hunyuan_3_opens_its_think_block_for_an_effort() -> None:
    template = ChatTemplate(vendored("models/templates/tencent-Hy3.jinja").read_text(encoding="utf-8"), "", "",
                            False)
    assert template.render(MESSAGES, kwargs=[("reasoning_effort", "low")]).endswith("<think:opensource>")
    assert template.render(MESSAGES).endswith("<think:opensource></think:opensource>")  # no_think: closed


def test_seed_oss_is_told_its_budget_by_its_template() -> None:
    """Seed-OSS's template takes the budget itself (``thinking_budget``: it tells the model how many tokens it may
    think): each API's budget is given to it, as well as enforced; other families' templates get no such variable."""
    chat = _chat("seed-oss", reasoning_budget=64, max_tokens=100).tool_chat()
    assert chat is not None and dict(chat.kwargs) == {"thinking_budget": 64}
    assert _chat("seed-oss", max_tokens=100).tool_chat().kwargs == ()  # type: ignore[union-attr]
    assert _chat("qwen3").template_kwargs(None, None, "p", budget=64) == {}
    responses = ResponsesRequest.model_validate({"model": "m", "input": "Hi", "max_output_tokens": 50,
                                                 "reasoning": {"max_tokens": 20}})
    responses.served_by(Serving(FAMILIES["seed-oss"], context=4096))
    assert dict(responses.tool_chat().kwargs) == {"thinking_budget": 20}  # type: ignore[union-attr]
    messages = MessagesRequest.model_validate({"model": "m", "messages": MESSAGES, "max_tokens": 50,
                                               "thinking": {"type": "enabled", "budget_tokens": 30}})
    messages.served_by(Serving(FAMILIES["seed-oss"], context=4096))
    assert dict(messages.tool_chat().kwargs)["thinking_budget"] == 30  # type: ignore[union-attr]
    source = vendored("models/templates/ByteDance-Seed-OSS.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(source, "", "", False)
    assert "thinking budget, which is 64" in template.render(MESSAGES, kwargs=[("thinking_budget", 64)])
    assert "thinking budget" not in template.render(MESSAGES)
