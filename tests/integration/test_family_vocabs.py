"""Gemma 4, whose server tests use LLaMA-2's tokenizer (sampling under a grammar over its 262k-token vocabulary costs
too much there: the grammar masks the whole vocabulary at each forced token), read through its real tokenizer here,
without sampling: a tiny synthetic model carrying its own vocabulary and template (from llama.cpp's source) is
loaded by the engine; each raw output is tokenized as the model would write it, its markers tokens of their own,
and what the engine shows of those tokens, streamed token by token, is read as the family's message. (Command R7B's
markers are not in the Command R tokenizer llama.cpp's source holds: that one is the first Command R's.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from family_cases import FAMILIES
from family_types import TOOLS, Family
from llamafleet.api.answer import AnswerSplitter, Split
from llamafleet.engine.families import markers
from llamafleet.engine.llama import Model
from llamafleet.engine.textside import TextSide
from llamafleet.engine.types import EngineConfig
from llamafleet.model.synth import SHAPES, find_template, find_vocab, write_model

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Family, TextSide[Model]]]:
    family = next(f for f in FAMILIES if f.name == "gemma4")
    path = write_model(tmp_path_factory.mktemp("vocab") / "gemma4.gguf", SHAPES["micro"], "q8_0",
                       find_vocab("gemma-4"), progress=False, chat_template=find_template(family.template))
    text: TextSide[Model] = TextSide()
    text.cfg = EngineConfig(model_path=str(path), n_gpu_layers=0)
    text.model = Model(text.cfg)
    yield family, text
    text.model.close()
    Path(path).unlink()


def test_the_real_tokenizer_writes_the_markers_as_tokens_and_the_answer_reads_the_same(
        side: tuple[Family, TextSide[Model]]) -> None:
    family, text = side
    known = text.family
    assert known is not None and known.name == family.name
    assert text.model.n_vocab > 200_000
    singles = [m for m in markers(known) if len(text.tokenize(m, False, True)) == 1]
    assert len(singles) >= 4, singles  # its markup is the vocabulary's own tokens, not spelled out
    for case in family.cases:
        ids = text.tokenize(case.output, False, True)
        assert text.detokenize(ids) == case.output  # (control tokens shown as their markers)
        splitter, out = AnswerSplitter(known, SCHEMAS, stream=True), Split()
        for token in ids:
            out += splitter.feed(text.token_bytes(token).decode("utf-8"))
        out += splitter.finish()
        assert out.reasoning == case.reasoning and out.content.strip() == case.content.strip(), case.what
        assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(case.calls), case.what
