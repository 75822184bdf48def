"""A checkpoint's tokenizer as the engine's text side reads a vocabulary: the same surface as the llama.cpp
:class:`~llamafleet.engine.llama.Model` offers :class:`~llamafleet.engine.textside.TextSide` (tokenize, each token's
bytes, BOS/EOS, the chat template), over Hugging Face's fast tokenizer (``tokenizer.json``).

Each token's bytes are worked out once at load from the tokenizer's own model: byte-level BPE vocabularies (GPT-2's
byte-to-character table), SentencePiece-style ones (``▁`` for a space, ``<0xNN>`` byte-fallback tokens); special
(control) tokens render as nothing in an answer, as llama.cpp renders them, and as their text in a prompt's echo.
The chat template is the one in ``tokenizer_config.json`` (or ``chat_template.jinja``), rendered by the engine's
sandboxed Jinja renderer, as ``transformers`` renders it. ``trust_remote_code`` is never on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llamafleet.engine.template import ChatTemplate

_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level table inverted: the printable character that stands for each byte -> the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _uses(node: Any, kind: str) -> bool:
    """Whether a tokenizer.json component (or a Sequence of them) is of type ``kind``."""
    if not isinstance(node, dict):
        return False
    if node.get("type") == kind:
        return True
    return any(_uses(n, kind) for key in ("decoders", "pretokenizers") for n in node.get(key) or [])


class GrammarUnsupported(ValueError):
    """A request feature the torch engine does not implement (answered 400, naming the llama.cpp engine)."""


class HfVocab:
    """The tokenizer of the checkpoint folder ``folder``."""

    causal = True
    reranks = False

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        if not isinstance(tok, PreTrainedTokenizerFast):
            raise ValueError(f"{folder}: the tokenizer is not a fast tokenizer (no tokenizer.json); save it with "
                             "transformers' save_pretrained to write one")
        self.tok = tok
        self.tk = tok.backend_tokenizer
        spec = json.loads(self.tk.to_str())
        self.n_vocab = self.tk.get_vocab_size(with_added_tokens=True)
        special = {a.content: i for i, a in tok.added_tokens_decoder.items() if a.special}
        self.special_ids = set(special.values())
        byte_level = _uses(spec.get("decoder"), "ByteLevel") or _uses(spec.get("pre_tokenizer"), "ByteLevel")
        table = _byte_decoder() if byte_level else {}
        self.pieces: list[bytes] = [b""] * self.n_vocab
        self._texts: list[str] = [""] * self.n_vocab
        for text, i in self.tk.get_vocab(with_added_tokens=True).items():
            if i >= self.n_vocab:
                continue
            self._texts[i] = text
            if i in self.special_ids:
                continue
            if byte_level:
                known = all(c in table for c in text)
                self.pieces[i] = bytes(table[c] for c in text) if known else text.encode()
            elif m := _BYTE.match(text):
                self.pieces[i] = bytes([int(m.group(1), 16)])
            else:
                self.pieces[i] = text.replace("▁", " ").encode()
        self.bos = tok.bos_token_id if tok.bos_token_id is not None else -1
        probe = self.tk.encode("a", add_special_tokens=True).ids
        self.add_bos = self.bos >= 0 and probe[:1] == [self.bos]
        self.eos = tok.eos_token_id if tok.eos_token_id is not None else -1
        self._template = tok.chat_template if isinstance(tok.chat_template, str) else None
        self._compiled: ChatTemplate | None = None

    def end_ids(self, config_eos: Any) -> set[int]:
        """The end-of-generation tokens: the tokenizer's EOS and those of ``config.json`` / the generation config."""
        ids = {self.eos} if self.eos >= 0 else set()
        for e in config_eos if isinstance(config_eos, list) else [config_eos]:
            if isinstance(e, int) and 0 <= e < self.n_vocab:
                ids.add(e)
        return ids

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        self.tk.encode_special_tokens = not parse_special  # special-token spellings as plain text unless parsed
        ids: list[int] = self.tk.encode(text, add_special_tokens=add_special).ids
        return ids

    def special_piece(self, token: int) -> bytes:
        return self.pieces[token] or self._texts[token].encode()

    def special_texts(self) -> tuple[str, str]:
        return (self._texts[self.bos] if self.bos >= 0 else "", self._texts[self.eos] if self.eos >= 0 else "")

    def chat_template(self, name: str | None = None) -> str | None:
        return self._template if name is None else None

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this checkpoint's tokenizer_config.json has no chat_template, so chats cannot be "
                             "formatted; send the prompt to /v1/completions")
        if self._compiled is None:
            self._compiled = ChatTemplate(self._template, *self.special_texts(), strip_bos=self.add_bos)
        return self._compiled.render(messages)

    def fim_tokens(self) -> tuple[int, int, int, int, int]:
        return (-1, -1, -1, -1, -1)  # fill-in-the-middle is the llama.cpp engine's (NoFimTokens, a 400)

    def check_grammar(self, grammar: str) -> None:
        raise GrammarUnsupported("grammars and structured output (grammar, response_format with a schema, forced "
                                 "tool calls) are not implemented by the torch engine; serve the model as a GGUF "
                                 "with the llama.cpp engine for them")
