"""Model families without a model: each real template (from llama.cpp's source) is recognised as its family, each
raw output is split into reasoning, content and calls, whole and streamed in every split, the same way; forced-call
grammars parse; the reasoning budget closes the think block; docs/MODELS.md is the matrix of tests/family_cases.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from family_cases import FAMILIES
from family_matrix import matrix
from family_types import TOOLS, Case, Family
from llamafleet.api.answer import AnswerSplitter, Split, split
from llamafleet.api.call_stream import SHAPES, CallPiece, CallReader, Shape
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.tools import Serving, Tool, calls_grammar
from llamafleet.engine import families
from llamafleet.engine.budget import ThinkBudget
from llamafleet.engine.grammar import after_thinking, check_gbnf, inside_think, json_schema_grammar
from llamafleet.engine.template import ChatTemplate, tool_template
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


def test_every_template_in_llama_cpps_source_that_takes_tools_is_read_as_a_family() -> None:
    """Each of llama.cpp's templates that lists tools is recognised as a family whose calls are read (not only a
    think block), and each family of the matrix has a template there."""
    folder = vendored(f"models/templates/{FAMILIES[0].template}.jinja").parent
    sources = {path.stem: path.read_text(encoding="utf-8") for path in folder.glob("*.jinja")}
    unread = [name for name, source in sources.items() if "tools" in source
              and getattr(families.detect(source), "name", "think") == "think"]
    assert unread == [] and len(sources) > 60
    assert {f.template for f in FAMILIES} <= set(sources)


def _expect(out: Split, case: Case) -> None:
    assert out.reasoning == case.reasoning
    assert out.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(case.calls)
    assert tuple(c.id for c in out.calls if c.id) == case.ids


@pytest.mark.parametrize(("family", "case"), CASES, ids=_id)
def test_each_output_is_read_as_the_family_writes_it(family: Family, case: Case) -> None:
    known, text = written(family, case)
    _expect(split(text, known, SCHEMAS), case)


def _assembled(pieces: list[CallPiece]) -> list[tuple[str, str, str | None]]:
    """The calls a client puts together from streamed pieces: (name, arguments, id) by index."""
    calls: dict[int, list[Any]] = {}
    for p in pieces:
        if p.name is not None:
            assert p.index == len(calls), "a new call takes the next index"
            calls[p.index] = [p.name, "", p.id]
        calls[p.index][1] += p.arguments
    return [(name, args, i) for name, args, i in calls.values()]


@pytest.mark.parametrize(("family", "case"), CASES, ids=_id)
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_in_any_split_it_is_read_the_same_and_no_markup_leaks(family: Family, case: Case,
                                                                     step: int) -> None:
    """Streamed, calls go out as they are written (before the end, where the format allows it) and come together as
    the whole answer's calls; the content and reasoning are the same."""
    known, text = written(family, case)
    splitter = AnswerSplitter(known, SCHEMAS, stream=True)
    out, early = Split(), 0
    for i in range(0, len(text), step):
        part = splitter.feed(text[i:i + step])
        assert not part.calls  # the list of calls comes at the end
        early += len(part.pieces)
        out += part
    out += splitter.finish()
    for marker in families.markers(known) if out.calls else ():
        assert marker not in out.content and marker not in out.reasoning
        assert all(marker not in p.arguments for p in out.pieces)
    calls = _assembled(out.pieces)
    if case.streamed is not None:  # the call went out before its arguments broke: it stays a call
        assert [(name, args) for name, args, _ in calls] == list(case.streamed) and not out.content
        return
    assert [(name, json.loads(args)) for name, args, _ in calls] == list(case.calls)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(case.calls)
    assert tuple(i for _, _, i in calls if i) == case.ids
    assert out.reasoning == case.reasoning and out.content.strip() == case.content.strip()
    if case.calls and known.calls in SHAPES:  # each call goes out before the end (Gemma's arguments whole)
        pieces = 2 if step < 10 and known.calls != "gemma" else 1  # (fed at once: a piece each)
        assert early >= len(case.calls) * pieces, "calls stream as they are written"


def test_streamed_arguments_grow_as_the_model_writes_them() -> None:
    """A Llama 3 call without its tag (JSON only): named once the name is read, its arguments piece by piece,
    nothing in the content; Qwen3-Coder's XML sends each parameter when it is closed, as JSON members."""
    splitter = AnswerSplitter(families.FAMILIES["llama3"], SCHEMAS, stream=True)
    said = [splitter.feed(t) for t in ['{"name": "special', '_function", "parameters": ', '{"arg1"', ': 1', "}}"]]
    assert [p.pieces for p in said[:2]] == [[], []] and not any(p.content for p in said)
    assert said[2].pieces == [CallPiece(0, '{"arg1"', "special_function")]
    assert [p.arguments for s in said[3:] for p in s.pieces] == [": 1", "}"]
    end = splitter.finish()
    assert end.pieces == [] and [c.name for c in end.calls] == ["special_function"] and end.content == ""
    splitter = AnswerSplitter(families.FAMILIES["qwen3-coder"], SCHEMAS, stream=True)
    head = "<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1"
    assert splitter.feed(head).pieces == []  # named, but nothing of its arguments is known yet
    assert splitter.feed("\n</parameter>\n").pieces == [CallPiece(0, '{"arg1": 1', "special_function_with_opt")]
    assert splitter.feed("<parameter=arg2>\n2\n</parameter>\n</function>").pieces == [
        CallPiece(0, ', "arg2": 2'), CallPiece(0, "}")]


def test_a_streamed_call_cut_by_the_token_limit_stays_a_call_and_later_text_is_dropped() -> None:
    splitter = AnswerSplitter(families.FAMILIES["qwen3"], SCHEMAS, stream=True)
    out = splitter.feed('Sure.<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1')
    out += splitter.finish(cut=True)
    assert out.content == "Sure." and _assembled(out.pieces) == [("special_function", '{"arg1": 1', None)]
    assert [c.arguments for c in out.calls] == ['{"arg1": 1']


def test_calls_the_reader_cannot_follow_go_out_whole_at_the_end() -> None:
    """Arguments before the name, or Mistral Nemo's list (its ids after the arguments): sent whole, in order."""
    for name, text in (("qwen3", '<tool_call>{"arguments": {"arg1": 1}, "name": "special_function"}</tool_call>'),
                       ("mistral", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, '
                                   '"id": "abcdefghi"}]')):
        splitter = AnswerSplitter(families.FAMILIES[name], SCHEMAS, stream=True)
        assert splitter.feed(text).pieces == []
        assert [(p.index, p.name) for p in splitter.finish().pieces] == [(0, "special_function")]


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
    opener = json.dumps(family.openers[0], ensure_ascii=False)[1:-1]  # (as a GBNF literal spells it)
    assert opener in grammar or family.name == "llama3" or (  # written as the family writes calls
        family.lead and not many)  # (Functionary v3.2: its prompt wrote the opener of the first call)
    assert grammar.startswith(("root ::= (think-open", "root ::= ((think-open")) == (family.think is not None)
    assert grammar.startswith("root ::= ((think-open think-body)? think-close)? answer") == (name == "minimax-m3")
    if family.think is not None:  # (a prompt that opened the block: it must be closed, whatever came alone)
        assert inside_think(grammar).startswith("root ::= think-body think-close answer")


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
    assert doc.read_text(encoding="utf-8") == matrix(), "run: python tests/family_matrix.py"


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


@pytest.mark.parametrize(("template", "says"), [
    ("meetkai-functionary-medium-v3.2", '>>>special_function\n{"arg1": 1}'),  # the arguments as JSON text
    ("fireworks-ai-llama-3-firefunction-v2", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]'),
    ("LFM2.5-8B-A1B", "<|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>"),
    ("meetkai-functionary-medium-v3.1", '<function=special_function>{"arg1": 1}</function>'),
])
def test_templates_that_failed_on_earlier_calls_render_them(template: str, says: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Functionary v3.2 wants earlier calls' arguments as JSON text (found at load), FireFunction v2 the tools as
    ``functions`` and a ``datetime``: each renders a conversation with an earlier call and its result, no warning."""
    call = {"id": "call_1", "type": "function", "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}
    req = ChatCompletionRequest.model_validate({"model": "m", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]})
    chat = req.tool_chat()
    assert chat is not None
    loaded = tool_template(vendored(f"models/templates/{template}.jinja").read_text(encoding="utf-8"), "<s>", "</s>",
                           True)
    assert loaded is not None and not [r for r in caplog.records if "cannot" in r.message]
    prompt = loaded.render(chat.messages, chat.tools, chat.kwargs)
    assert says in prompt and "42" in prompt
    assert "special_function_with_opt" in prompt  # the tools are listed


def test_a_template_that_takes_earlier_calls_no_way_warns_once_and_refuses_them(
        caplog: pytest.LogCaptureFixture) -> None:
    source = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments.x.y }}{% endfor %}"
              "{{ m.content }}{% endfor %}{{ tools | length }}<think>")
    loaded = tool_template(source, "", "", False)
    assert loaded is not None  # still used for conversations without earlier calls
    assert [r.message for r in caplog.records if "earlier tool calls" in r.message]
    with pytest.raises(ValueError, match="chat template"):
        loaded.render([{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "probe", "arguments": {}}}]}], [TOOLS[0]])


def test_a_long_parameter_is_looked_at_once_not_at_every_piece() -> None:
    """An XML parameter is complete only at its closing tag: the reader matches it when a tag that can end one has
    come, not on every piece (which would read a long value again at each of its tokens)."""
    tried = []

    class Counted:
        def __init__(self, pattern: Any) -> None:
            self.pattern = pattern

        def match(self, text: str, at: int) -> Any:
            tried.append(at)
            return self.pattern.match(text, at)

    shape = SHAPES["xml"]
    reader = CallReader("xml", SCHEMAS)
    reader.shape = Shape(shape.start, shape.gap, Counted(shape.param), Counted(shape.close),  # type: ignore[arg-type]
                         shape.ends)
    section = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n" + "7" * 3000
    pieces = [p for i in range(1, len(section) + 1) for p in reader.read(section[:i])]
    assert pieces == [] and len(tried) <= 2
    section += "\n</parameter>\n</function>"
    assert [p.arguments for p in reader.read(section)] == ['{"arg1": ' + "7" * 3000, "}"]


_M3 = families.M3
_NESTED = {"tags": {"type": "array", "items": {"type": "string"}},
           "entries": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                                  "label": {"type": "string"}}}},
           "number": {"type": "object", "properties": {"real": {"type": "number"}, "imaginary": {"type": "number"}}},
           "limit": {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"max": {"type": "integer"}}}]},
           "label": {"anyOf": [{"type": "string"}, {"type": "object"}]},
           "enabled": {"type": "boolean"}}


def _el(key: str, inner: str) -> str:
    return f"{_M3}<{key}>{inner}{_M3}</{key}>"


@pytest.mark.parametrize(("params", "expected"), [
    (_el("tags", _el("item", "alpha") + _el("item", "beta"))
     + _el("entries", _el("item", _el("id", "1") + _el("label", "one"))),
     {"tags": ["alpha", "beta"], "entries": [{"id": 1, "label": "one"}]}),
    (_el("number", _el("real", "1.5") + _el("imaginary", "-2.5")), {"number": {"real": 1.5, "imaginary": -2.5}}),
    (_el("limit", "5"), {"limit": 5}),
    (_el("limit", _el("max", "10")), {"limit": {"max": 10}}),
    (_el("label", _el("text", "hi")), {"label": _el("text", "hi")}),  # a string alternative: the text as written
    (_el("enabled", "true"), {"enabled": True}),
])
def test_minimax_m3_writes_objects_and_arrays_as_nested_elements(params: str, expected: dict[str, Any]) -> None:
    """MiniMax M3 (the cases of llama.cpp's tests, with tools of our own): a parameter's nested elements are read as
    the object or array its schema wants (an array's as ``<item>`` elements), a union with a string as text; whole
    and streamed alike."""
    tools = {"nested": {"type": "object", "properties": _NESTED}}
    text = f'</mm:think>{_M3}<tool_call>\n{_M3}<invoke name="nested">{params}{_M3}</invoke>\n{_M3}</tool_call>'
    known = families.FAMILIES["minimax-m3"]
    whole = split(text, known, tools)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [("nested", expected)] and not whole.content
    splitter = AnswerSplitter(known, tools, stream=True)
    out = Split()
    for i in range(0, len(text), 5):
        out += splitter.feed(text[i:i + 5])
    out += splitter.finish()
    assert [(name, json.loads(args)) for name, args, _ in _assembled(out.pieces)] == [("nested", expected)]


def test_functionary_v32_answers_a_schema_as_text_to_all() -> None:
    """Functionary v3.2 writes text to the recipient ``all``: a JSON schema's answer comes after ``all\\n`` (the
    prompt wrote the ``>>>``), and reads as the content."""
    family = families.FAMILIES["functionary-v3.2"]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                                "response_format": {"type": "json_object"}})
    req.served_by(Serving(family))
    grammar = req.constraint
    assert grammar is not None and 'root ::= "all\\n" object' in grammar.splitlines()
    assert split('all\n{"a": 1}', family, {}).content == '{"a": 1}'
