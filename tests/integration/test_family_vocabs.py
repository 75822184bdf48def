"""The families whose own tokenizer llama.cpp's source holds (Qwen 2.5/3's qwen2, Qwen 3.5's qwen35, Llama 3's
llama-bpe, Gemma 4's), read through it here, without sampling: their server tests use LLaMA-2's tokenizer (sampling
under a grammar over 128k-262k tokens costs too much there: the grammar masks the whole vocabulary at each forced
token). A tiny synthetic model carrying the tokenizer is loaded by the engine, one per tokenizer; each raw output is
tokenized as the model would write it (Gemma 4's markers tokens of their own), and what the
engine shows of those tokens, streamed token by token, is read as the family's message. (Command R7B's markers are
not in the Command R tokenizer llama.cpp's source holds: that one is the first Command R's.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from family_cases import FAMILIES
from family_types import TOOLS, Family
from llamafleet.api.answer import AnswerSplitter, Split
from llamafleet.engine import families
from llamafleet.engine.families import markers
from llamafleet.engine.llama import Model
from llamafleet.engine.textside import TextSide
from llamafleet.engine.types import EngineConfig
from llamafleet.model.synth import SHAPES, find_vocab, write_model

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
OWN = [f for f in FAMILIES if f.vocab != "llama-spm"]
SINGLES = {"gemma4": 4}  # the least of its markers that are one token each (the qwen2, qwen35 and llama-bpe
# tokenizers of llama.cpp's source are the base vocabularies, without the chat models' added tokens)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TextSide[Model]]]:
    """The engine's text side of one model per tokenizer (the template does not matter to reading outputs)."""
    folder = tmp_path_factory.mktemp("vocab")
    out: dict[str, TextSide[Model]] = {}
    for vocab in sorted({f.vocab for f in OWN}):
        path = write_model(folder / f"{vocab}.gguf", SHAPES["micro"], "q8_0", find_vocab(vocab), progress=False)
        text: TextSide[Model] = TextSide()
        text.cfg = EngineConfig(model_path=str(path), n_gpu_layers=0)
        text.model = Model(text.cfg)
        out[vocab] = text
    yield out
    for text in out.values():
        text.model.close()
        Path(text.cfg.model_path).unlink()


def test_the_families_with_their_own_tokenizers() -> None:
    assert {f.name for f in OWN} == {"qwen3", "qwen3.5", "llama3", "functionary", "firefunction",
                                     "functionary-v3.2", "gemma4"}


@pytest.mark.parametrize("family", OWN, ids=[f.name for f in OWN])
def test_the_real_tokenizer_writes_the_markers_as_tokens_and_the_answer_reads_the_same(
        family: Family, sides: dict[str, TextSide[Model]]) -> None:
    text = sides[family.vocab]
    known = families.FAMILIES[family.name]
    assert text.model.n_vocab > 100_000
    singles = [m for m in markers(known) if len(text.tokenize(m, False, True)) == 1]
    print(family.name, singles)
    assert len(singles) >= SINGLES.get(family.name, 0), singles  # its markup: the vocabulary's own tokens
    for case in family.cases:
        ids = text.tokenize(case.output, False, True)
        assert text.detokenize(ids) == case.output  # (control tokens shown as their markers)
        splitter, out = AnswerSplitter(known, SCHEMAS, stream=True), Split()
        if family.opens_think and known.think:  # (the worker puts the open marker first, as the prompt wrote it)
            out += splitter.feed(known.think[0])
        for token in ids:
            out += splitter.feed(text.token_bytes(token).decode("utf-8"))
        out += splitter.finish()
        if case.streamed is not None:  # a call that went out before its arguments broke stays a call
            assert [(c.name, c.arguments) for c in out.calls] == list(case.streamed), case.what
            continue
        assert out.reasoning == case.reasoning and out.content.strip() == case.content.strip(), case.what
        assert [(c.name, json.loads(c.arguments)) for c in out.calls] == list(case.calls), case.what
