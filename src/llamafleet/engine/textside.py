"""The engine's text side: the model's vocabulary and chat templates, and whether a request can ever run.

What a worker does with a request before the engine schedules it: text to tokens (a chat through the model's
template, :mod:`llamafleet.engine.chat` and :mod:`llamafleet.engine.template`), tokens back to text and bytes, and
the checks that make a request the client's error (400) instead of the replica's. The engine
(:class:`~llamafleet.engine.engine.Engine`) takes these methods from :class:`TextSide`; they touch only the model
and the configuration, never the running sequences.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from functools import cached_property, partial
from typing import Generic, Protocol, TypeVar

from llamafleet.engine.chat import chat_tokens, tool_chat_tokens
from llamafleet.engine.families import Family, markers
from llamafleet.engine.infill import FimTokens, Infill, infill_tokens
from llamafleet.engine.template import ChatTemplate, ToolChat, tool_template
from llamafleet.engine.types import ContextOverflow, EngineConfig, Request, RequestOutput, check_token_ids


class Vocab(Protocol):
    """What the text side reads of a model: llama.cpp's :class:`~llamafleet.engine.llama.Model`, or a checkpoint's
    tokenizer (:class:`~llamafleet.engine.pytorch.vocab.HfVocab`)."""

    pieces: list[bytes]  # each token's bytes (control tokens: none)
    n_vocab: int
    add_bos: bool
    causal: bool
    reranks: bool  # its pooling type is rank: it scores query-document pairs and generates nothing

    @property
    def bos(self) -> int: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def special_piece(self, token: int) -> bytes: ...
    def special_texts(self) -> tuple[str, str]: ...
    def chat_template(self, name: str | None = None) -> str | None: ...
    def apply_chat_template(self, messages: Seq[dict[str, str]], add_generation_prompt: bool = True) -> str: ...
    def fim_tokens(self) -> tuple[int, int, int, int, int]: ...
    def check_grammar(self, grammar: str) -> None: ...


V = TypeVar("V", bound=Vocab)


class TextSide(Generic[V]):
    """Tokens, text and request checks for one loaded model (``model``, ``cfg``: set by the engine)."""

    model: V
    cfg: EngineConfig

    @property
    def n_ctx_per_seq(self) -> int:
        return self.cfg.n_ctx_per_seq

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Iterable[int]) -> str:
        return b"".join(self.model.pieces[t] for t in tokens).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (part of a UTF-8 character for byte-fallback tokens)."""
        return self.model.pieces[token]

    def tokenize_infill(self, req: Infill, max_tokens: int | None) -> list[int]:
        """A fill-in-the-middle prompt (:mod:`~llamafleet.engine.infill`) cut to leave room for ``max_tokens`` (a
        quarter of the context when unlimited); :class:`~llamafleet.engine.infill.NoFimTokens` (a ``ValueError``)
        when the model has no FIM tokens."""
        n_ctx = self.cfg.n_ctx_per_seq
        budget = n_ctx - (n_ctx // 4 if max_tokens is None else max_tokens)
        bos = self.model.bos if self.model.add_bos else None
        return infill_tokens(req, FimTokens(*self.model.fim_tokens()), lambda t: self.tokenize(t, False, False),
                             budget, bos)

    def tokens_output(self, request_id: str, ids: list[int], chat: bool) -> RequestOutput:
        """A request that is only tokenized, answered in one finished output: ``ids`` (``prompt_ids``), their count,
        each distinct id's bytes (control tokens written out) and the whole as text. A chat's text leaves out the BOS
        the tokenizer put first, so that tokenizing it again as a prompt (BOS added, special tokens parsed) gives
        ``ids`` back. Ids outside the vocabulary (a client's) are a ``ValueError``."""
        check_token_ids(tuple(ids), self.model.n_vocab)
        pieces = {t: self.model.special_piece(t) for t in set(ids)}
        skip = int(chat and self.model.add_bos and ids[:1] == [self.model.bos])
        text = b"".join(pieces[t] for t in ids[skip:]).decode("utf-8", errors="replace")
        return RequestOutput(request_id=request_id, text=text, token_ids=[], logprobs=None, finished=True,
                             finish_reason="length", prompt_tokens=len(ids), token_bytes=pieces, prompt_ids=ids)

    def apply_chat_template(self, messages: Seq[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.model.apply_chat_template(messages, add_generation_prompt)

    @cached_property
    def tool_template(self) -> ChatTemplate | None:
        """The GGUF's Jinja template (its ``tool_use`` one first) when it shows tools or is of a known family,
        compiled on first use."""
        m = self.model
        return tool_template(m.chat_template("tool_use") or m.chat_template(), *m.special_texts(), m.add_bos)

    @cached_property
    def family(self) -> Family | None:
        """The model's family, recognised from its template (None: the generic path). Its markers are shown in the
        answer's text even where the vocabulary holds them as control tokens (which render as nothing otherwise),
        so the API can read the reasoning and the calls."""
        family = None if self.tool_template is None else self.tool_template.family
        if family is not None:
            for marker in markers(family):
                ids = self.tokenize(marker, False, True)
                if len(ids) == 1 and not self.model.pieces[ids[0]]:
                    self.model.pieces[ids[0]] = marker.encode()
        return family

    def opened_think(self, prompt: Seq[int]) -> str:
        """The family's think marker when the prompt ``prompt`` ends with it (the template opened the think block:
        the answer starts inside it), else ""."""
        think = None if self.family is None else self.family.think  # (a token holds at least one character)
        if think is None or not self.detokenize(prompt[-len(think[0]) - 4:]).rstrip().endswith(think[0]):
            return ""
        return think[0]

    def tokenize_chat(self, messages: Seq[dict[str, str]], tools: ToolChat | None = None) -> list[int]:
        """Chat messages -> prompt tokens: the template's markup parsed as special tokens, message contents never
        (see :mod:`llamafleet.engine.chat`). A conversation with ``tools`` is rendered by the model's own template
        when it shows tools and nothing outside the contents spells a special token; otherwise ``messages`` (their
        generic rendering) by the template of the model's family (so its own markup, an opened think block
        included, stays), or else by llama.cpp's."""
        template = self.tool_template
        if tools is not None and template is not None and template.renders(bool(tools.tools)):
            ids = tool_chat_tokens(tools, template, self.tokenize)
            if ids is not None:
                return ids
        if template is not None and template.family is not None and template.plain:
            return chat_tokens(messages, partial(template.render, kwargs=tools.kwargs if tools else ()),
                               self.tokenize)
        return chat_tokens(messages, self.apply_chat_template, self.tokenize)

    def message_at(self, messages: Seq[dict[str, str]], tools: ToolChat | None, index: int) -> int:
        """The message (from 0) of the chat ``messages`` whose rendering holds prompt token ``index``: the first
        one such that the conversation up to it renders past that token (a binary search: a few renderings)."""
        lo, hi = 0, len(messages) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tokenize_chat(messages[:mid + 1], tools)) > index:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def check_request(self, req: Request) -> None:
        """Raise ``ValueError`` (:class:`ContextOverflow` with the numbers when it is too long) if ``req`` can never
        run in this engine."""
        n = len(req.prompt_tokens)
        limit = self.cfg.n_ctx_per_seq
        if self.model.reranks:  # encoders and decoders alike (Qwen3-Reranker is a decoder with a classifier head)
            raise ValueError("this model is a reranker (its pooling type is 'rank') and cannot generate text; use "
                             "POST /v1/rerank, or serve a generative model")
        if not self.model.causal:
            raise ValueError("this model is an embedding model (an encoder: it attends both ways) and cannot "
                             "generate text; use POST /v1/embeddings, or serve a generative model")
        if n == 0:
            raise ValueError("the prompt is empty: it must contain at least one token")
        ContextOverflow.check(limit, n, req.params.max_tokens)
        check_token_ids(req.prompt_tokens, self.model.n_vocab)
        if biased := [t for t, _ in req.params.logit_bias if t >= self.model.n_vocab]:
            raise ValueError(f"logit_bias names token ids outside the vocabulary [0, {self.model.n_vocab}): "
                             f"{biased[:5]}")
        if req.params.grammar is not None:  # parsed here, where a bad one is still the client's error to hear
            self.model.check_grammar(req.params.grammar)
