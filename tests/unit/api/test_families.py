"""Model families without a model: each real template (from llama.cpp's source) is recognised as its family, each
raw output is split into reasoning, content and calls, whole and streamed in every split, the same way; forced-call
grammars parse; the reasoning budget closes the think block; docs/MODELS.md is the matrix of tests/family_cases.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from family_cases import FAMILIES, TOOLS, UNRECOGNISED, Case, Family, matrix
from llamafleet.api.answer import AnswerSplitter, Split, split
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.tools import Serving, Tool, calls_grammar
from llamafleet.engine import families
from llamafleet.engine.budget import ThinkBudget
from llamafleet.engine.grammar import after_thinking, check_gbnf, inside_think, json_schema_grammar
from llamafleet.engine.template import ChatTemplate
from llamafleet.model.synth import vendored

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CASES = [(f, c) for f in FAMILIES for c in f.cases]


def _id(value: object) -> str:
    return f"{value[0].name}-{value[1].what}" if isinstance(value, tuple) else str(value)


def written(family: Family, case: Case) -> tuple[families.Family, str]:
    """The family as the server knows it, and the answer's text as the API gets it (the worker puts the open marker
    first when the template opened the think block)."""
    known = families.FAMILIES[family.name]
    return known, (known.think[0] if family.opens_think and known.think else "") + case.output


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_real_template_is_recognised_as_its_family(family: Family) -> None:
    source = vendored(f"models/templates/{family.template}.jinja").read_text(encoding="utf-8")
    found = families.detect(source)
    assert found is not None and found.name == family.name


@pytest.mark.parametrize("template", UNRECOGNISED)
def test_templates_in_other_markup_are_no_family(template: str) -> None:
    found = families.detect(vendored(f"models/templates/{template}.jinja").read_text(encoding="utf-8"))
    assert found is None or found.name == "think"  # reasoning alone may be split; their calls are not read


def _expect(out: Split, case: Case) -> None:
    assert out.reasoning == case.reasoning
    assert out.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(case.calls)
    assert tuple(c.id for c in out.calls if c.id) == case.ids


@pytest.mark.parametrize(("family", "case"), CASES, ids=_id)
def test_each_output_is_read_as_the_family_writes_it(family: Family, case: Case) -> None:
    known, text = written(family, case)
    _expect(split(text, known, SCHEMAS), case)


@pytest.mark.parametrize(("family", "case"), CASES, ids=_id)
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_in_any_split_it_is_read_the_same_and_no_markup_leaks(family: Family, case: Case,
                                                                     step: int) -> None:
    known, text = written(family, case)
    splitter = AnswerSplitter(known, SCHEMAS)
    out = Split()
    for i in range(0, len(text), step):
        part = splitter.feed(text[i:i + step])
        assert not part.calls  # calls come whole, at the end
        out += part
    out += splitter.finish()
    if out.calls:
        out.content = out.content.strip()
        for marker in families.markers(known):
            assert marker not in out.content and marker not in out.reasoning
    _expect(out, case)


def test_a_call_cut_by_the_token_limit_never_reaches_the_content() -> None:
    known = families.FAMILIES["qwen3"]
    cut = 'Sure.<tool_call>\n{"name": "special_function", "argu'
    assert split(cut, known, SCHEMAS, cut=True) == Split(content="Sure.")
    assert split(cut, known, SCHEMAS).content == cut  # ended by the model: it is text
    whole = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n'
    assert split(whole + cut, known, SCHEMAS, cut=True) == Split(calls=split(whole, known, SCHEMAS).calls)


def test_a_forced_answer_holds_everything_after_the_reasoning() -> None:
    splitter = AnswerSplitter(families.FAMILIES["deepseek-r1"], SCHEMAS, forced=True)
    assert splitter.feed("<think>hm</think>\n") == Split(reasoning="hm")
    assert splitter.feed("\n<｜tool▁calls▁begin｜>") == Split()
    rest = "<｜tool▁call▁begin｜>special_function<｜tool▁sep｜>{\"arg1\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    assert splitter.feed(rest) == Split()
    assert [c.name for c in splitter.finish().calls] == ["special_function"]


@pytest.mark.parametrize("name", sorted(families.FAMILIES))
@pytest.mark.parametrize("many", [False, True])
def test_forced_call_grammars_are_valid_gbnf_in_the_family_format(name: str, many: bool) -> None:
    family = families.FAMILIES[name]
    grammar = calls_grammar([Tool.model_validate(t) for t in TOOLS], many, family)
    check_gbnf(grammar)
    assert ("{0,7}" in grammar) == many
    assert family.openers[0] in grammar or family.name == "llama3"  # written as the family writes calls
    assert grammar.startswith("root ::= (think-open") == (family.think is not None)


def test_the_think_block_comes_first_and_an_opened_one_must_close() -> None:
    grammar = after_thinking(json_schema_grammar({"type": "object"}), ("[THINK]", "[/THINK]"))
    check_gbnf(grammar)
    assert 'think-open ::= "[THINK]"' in grammar and "think-body ::= ([^\\[] | \"[\" [^/])*" in grammar
    assert inside_think(grammar).startswith("root ::= think-body think-close answer")
    assert inside_think("root ::= x\n") == "root ::= x\n"  # a grammar of the client's own: as it was
    assert after_thinking("root ::= x\n", None) == "root ::= x\n"


def _budget(limit: int, opened: bool) -> tuple[ThinkBudget, dict[int, bytes]]:
    words = {1: b"<think>", 2: b"hm ", 3: b"</", 4: b"think>", 5: b"ok"}
    budget = ThinkBudget.of(limit, families.FAMILIES["qwen3"], lambda text: [3, 4], opened)
    assert budget is not None
    return budget, words


@pytest.mark.parametrize("opened", [False, True])
def test_the_budget_forces_the_close_marker_after_its_tokens(opened: bool) -> None:
    budget, words = _budget(2, opened)
    forced = []
    for tok in ([] if opened else [1]) + [2, 2, 2, 2, 2, 2]:
        logits = np.zeros(6, dtype=np.float32)
        budget.force(logits)
        if logits.max() > 0:
            tok = int(np.argmax(logits))
            forced.append(tok)
        budget.saw(tok, words[tok])
    assert forced == [3, 4] and budget.over


def test_no_budget_is_spent_outside_the_think_block_or_after_the_model_closed_it() -> None:
    budget, words = _budget(2, False)
    for tok in [2, 2, 2, 2]:  # no think block: nothing counted
        budget.saw(tok, words[tok])
    assert budget.next_forced() is None
    budget, words = _budget(3, True)
    for tok in [2, 3, 4, 5, 5, 5]:  # closed by the model itself
        budget.saw(tok, words[tok])
    assert budget.over and budget.next_forced() is None
    assert ThinkBudget.of(5, families.FAMILIES["llama3"], lambda text: [], True) is None  # it does not think


def test_models_md_is_the_matrix_of_the_tests() -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "MODELS.md"
    assert doc.read_text(encoding="utf-8") == matrix(), "run: python tests/family_cases.py"


def test_earlier_reasoning_is_replayed_or_dropped_as_the_template_says() -> None:
    """Qwen3's template shows the reasoning of the turns since the last user message (a call in progress), and
    drops that of earlier turns: the conversation gives it the reasoning sent back under either name."""
    call = {"id": "call_1", "type": "function", "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}
    messages = [{"role": "user", "content": "First?"},
                {"role": "assistant", "content": "One.", "reasoning_content": "OLD THOUGHT"},
                {"role": "user", "content": "Second?"},
                {"role": "assistant", "content": None, "reasoning": "NEW THOUGHT", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": TOOLS})
    req.served_by(Serving(families.FAMILIES["qwen3"]))
    chat = req.tool_chat()
    assert chat is not None
    source = vendored("models/templates/Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    prompt = ChatTemplate(source, "", "<|im_end|>", False).render(chat.messages, chat.tools, chat.kwargs)
    assert "NEW THOUGHT" in prompt and "OLD THOUGHT" not in prompt and "<tool_response>\n42" in prompt
