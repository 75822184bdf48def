"""A checkpoint's tokenizer as the engine's text side reads it: every token's bytes add up to the text, for
SentencePiece-style (LLaMA-2) and byte-level BPE (Qwen2) vocabularies alike; special-token spellings become control
tokens only when parsed, and render as nothing in an answer but as their text in a prompt's echo."""

from __future__ import annotations

import pytest

from llamafleet.engine.pytorch.vocab import HfVocab
from llamafleet.model.synth import find_vocab
from llamafleet.model.synth_hf import write_tokenizer

TEXT = "Hello world, 你好! tabs\tand\nnewlines é <0x41>"


@pytest.fixture(scope="module", params=[("llama-spm", "</s>"), ("qwen2", "<|im_end|>")], ids=["spm", "byte-bpe"])
def vocab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[HfVocab, str]:
    name, special = request.param
    folder = tmp_path_factory.mktemp(name)
    write_tokenizer(folder, find_vocab(name), "{{ bos_token }}{{ messages[0]['content'] }}")
    return HfVocab(folder), special


def test_the_pieces_of_a_text_are_its_bytes(vocab: tuple[HfVocab, str]) -> None:
    v, _ = vocab
    ids = v.tokenize(TEXT, False, False)
    text = b"".join(v.pieces[i] for i in ids).decode()
    assert text.removeprefix(" ") == TEXT  # SentencePiece writes the space it puts before the first word


def test_special_spellings_are_control_tokens_only_when_parsed(vocab: tuple[HfVocab, str]) -> None:
    v, special = vocab
    (control,) = v.tokenize(special, False, True)
    assert control in v.special_ids and v.pieces[control] == b"" and v.special_piece(control) == special.encode()
    assert control not in v.tokenize(special, False, False)
    assert v.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("hi")
