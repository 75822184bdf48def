"""Fill-in-the-middle prompts: llama-server's layout, the repository-level form, and what is cut to fit the budget."""

from __future__ import annotations

import pytest

from llamafleet.engine.infill import REPO, SNIPPET, FimTokens, Infill, NoFimTokens, infill_tokens

PRE, SUF, MID, REP, SEP, BOS = range(0x110000, 0x110006)  # past every code point
PLAIN = FimTokens(PRE, SUF, MID)
REPO_LEVEL = FimTokens(PRE, SUF, MID, REP, SEP)


def chars(text: str) -> list[int]:
    """A tokenizer of one token per character (its code point)."""
    return [ord(c) for c in text]


def text(ids: list[int]) -> str:
    names = {PRE: "<PRE>", SUF: "<SUF>", MID: "<MID>", REP: "<REP>", SEP: "<SEP>", BOS: "<s>"}
    return "".join(names[t] if t in names else chr(t) for t in ids)


def test_prefix_prompt_suffix_then_middle() -> None:
    ids = infill_tokens(Infill("def f(x):\n", "\n    return y\n", "    y = "), PLAIN, chars, 1000, BOS)
    assert text(ids) == "<s><PRE>def f(x):\n    y = <SUF>\n    return y\n<MID>"


def test_extra_files_come_first() -> None:
    req = Infill("a", "b", extra=(("lib.h", "int g();"), ("util.h", "int h();")))
    plain = text(infill_tokens(req, PLAIN, chars, 1000, None))
    assert plain == f"{SNIPPET}int g();{SNIPPET}int h();<PRE>a<SUF>b<MID>"
    repo = text(infill_tokens(req, REPO_LEVEL, chars, 1000, BOS))
    assert repo == f"<REP>{REPO}<SEP>lib.h\nint g();<SEP>util.h\nint h();<SEP>filename\n<s><PRE>a<SUF>b<MID>"


def test_what_does_not_fit_is_cut_where_it_matters_least() -> None:
    prefix, suffix = "".join(chr(ord("a") + i % 26) for i in range(300)), "Z" * 300
    req = Infill(prefix, suffix, "P", extra=(("f", "E" * 100),))
    ids = infill_tokens(req, PLAIN, chars, 101, BOS)
    assert len(ids) == 101
    room = 101 - 1 - 3 - 1  # BOS, the three FIM tokens, the prompt
    body = text(ids)
    kept_prefix = body[body.index("<PRE>") + 5:body.index("P<SUF>")]
    kept_suffix = body[body.index("<SUF>") + 5:body.index("<MID>")]
    assert prefix.endswith(kept_prefix) and suffix.startswith(kept_suffix)  # the text nearest the cursor stays
    assert len(kept_suffix) == room // 4 and len(kept_prefix) == room - room // 4
    assert body.startswith("<s>")  # no room was left for the extra context


def test_a_short_prefix_leaves_its_room_to_the_suffix_then_the_extra() -> None:
    ids = infill_tokens(Infill("ab", "Z" * 50, extra=(("f", "E" * 50),)), PLAIN, chars, 40, None)
    body = text(ids)
    assert len(ids) == 40 and "<PRE>ab<SUF>" in body and body.endswith("Z" * 35 + "<MID>")
    assert body.startswith("<PRE>")  # 2 + 35 + 3 = 40: nothing left for the extra


def test_a_model_without_fim_tokens_cannot_infill() -> None:
    with pytest.raises(NoFimTokens, match="no FIM_PRE, FIM_SUF, FIM_MID token"):
        infill_tokens(Infill("a", "b"), FimTokens(-1, -1, -1, 4), chars, 100, None)
