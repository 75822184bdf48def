"""llama.cpp's samplers on the CPU: a request's sampler chain and grammar, and the candidate buffers they run over.

Also the one-token greedy chain a context hands to llama.cpp for backend sampling (inside the graph). This module
comes below :mod:`llamafleet.engine.llama`: it needs of a model and a context only what :class:`Vocabulary` and
:class:`Scratch` name, so the two modules do not import each other.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, Protocol

import llama_cpp as lc  # isort: skip  (before numpy, see engine/llama.py)
import numpy as np
import numpy.typing as npt

from llamafleet.engine import llama_log
from llamafleet.engine.llama_backend import Native
from llamafleet.engine.types import SamplingParams

# ---------------------------------------------------------------------------------------------------------------
# Sampler chains (CPU): [grammar] -> penalties -> top_k -> typical_p -> top_p -> min_p -> temperature -> seeded draw
# ---------------------------------------------------------------------------------------------------------------
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class Candidates:
    """A ``llama_token_data_array`` over a numpy buffer (a context keeps one: sequences are sampled in turn)."""

    def __init__(self, n: int) -> None:
        self.data, self.ids = np.zeros(n, dtype=_TOKEN_DATA), np.arange(n, dtype=np.int32)
        self.struct = lc.llama_token_data_array(ctypes.cast(self.data.ctypes.data, ctypes.POINTER(lc.llama_token_data)))

    def run(self, sampler: Any, logits: npt.NDArray[np.float32] | None, ids: Sequence[int] | None = None) -> bool:
        """Refill from ``logits`` (None: keep what is there) and apply ``sampler``; False if it refused every token."""
        if logits is not None:
            n = len(logits)
            self.data["id"][:n] = self.ids[:n] if ids is None else ids
            self.data["logit"][:n], self.data["p"][:n] = logits, 0.0
            self.struct.size, self.struct.selected, self.struct.sorted = n, -1, False
        lc.llama_sampler_apply(sampler, ctypes.byref(self.struct))
        return not np.isneginf(self.data["logit"][: self.struct.size]).all()

    def selected(self) -> int:  # the token a sampler chose
        return int(self.data["id"][self.struct.selected])


def greedy_chain() -> Any:
    """A chain of llama.cpp's greedy sampler alone (what a context runs in-graph for a slot)."""
    sp = lc.llama_sampler_chain_default_params()
    sp.no_perf = True
    chain = lc.llama_sampler_chain_init(sp)
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    return chain


class Vocabulary(Protocol):
    """What a :class:`SamplerChain` reads of a model (:class:`llamafleet.engine.llama.Model`)."""

    n_vocab: int
    eog: npt.NDArray[np.bool_]

    def grammar_sampler(self, grammar: str) -> Any: ...


class Scratch(Protocol):
    """What :meth:`SamplerChain.sample` uses of a context (:class:`llamafleet.engine.llama.Context`): its buffers."""

    candidates: Candidates
    candidate: Candidates


class SamplerChain(Native):
    """A per-sequence llama.cpp sampler chain built from :class:`SamplingParams`, and beside it the request's grammar
    sampler (its parse state is this sequence's alone). The chain picks a token and the grammar checks that one;
    only if it is refused does the grammar mask the whole vocabulary (~5 ms for 49k tokens on one core) and the
    chain pick again (as llama.cpp's common sampler does). So every token fits the grammar, under any settings."""

    def __init__(self, params: SamplingParams, model: Vocabulary, seed: int) -> None:
        self.grammar = None if params.grammar is None else model.grammar_sampler(params.grammar)
        self.end = int(np.flatnonzero(model.eog)[0])  # answered when the grammar has no token left to allow
        sp = lc.llama_sampler_chain_default_params()
        sp.no_perf = True
        self.ptr = lc.llama_sampler_chain_init(sp)
        add = lc.llama_sampler_chain_add
        if params.logit_bias:  # first, so every later step (and greedy) sees the biased logits
            bias = (lc.llama_logit_bias * len(params.logit_bias))(*(lc.llama_logit_bias(t, b) for t, b in
                                                                    params.logit_bias))
            add(self.ptr, lc.llama_sampler_init_logit_bias(model.n_vocab, len(params.logit_bias), bias))
        if params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            add(self.ptr, lc.llama_sampler_init_penalties(
                model.n_vocab, params.penalty_last_n, params.repeat_penalty, params.frequency_penalty,
                params.presence_penalty))
        if params.greedy:
            add(self.ptr, lc.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(self.ptr, lc.llama_sampler_init_top_k(params.top_k))
        if params.typical_p < 1.0:
            add(self.ptr, lc.llama_sampler_init_typical(params.typical_p, 1))
        if params.top_p < 1.0:
            add(self.ptr, lc.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(self.ptr, lc.llama_sampler_init_min_p(params.min_p, 1))
        add(self.ptr, lc.llama_sampler_init_temp(params.temperature))
        add(self.ptr, lc.llama_sampler_init_dist(seed))

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` (the prompt's tail) to the penalties' window; the grammar never sees them."""
        for t in tokens:
            lc.llama_sampler_accept(self.ptr, t)

    def sample(self, ctx: Scratch, logits: npt.NDArray[np.float32]) -> int:
        """The next token from one row of ``logits``, accepted by the chain and the grammar. A grammar that allows
        no token at all (a dead end of a client's GBNF) ends the answer with end-of-generation."""
        (cands := ctx.candidates).run(self.ptr, logits)
        tok = cands.selected()
        if self.grammar is not None:
            if not ctx.candidate.run(self.grammar, logits[tok:tok + 1], [tok]):
                if not cands.run(self.grammar, logits):
                    llama_log.log.warning("the grammar allows no token here (a dead end); ending the answer")
                    return self.end
                cands.run(self.ptr, None)
                tok = cands.selected()
            lc.llama_sampler_accept(self.grammar, tok)
        lc.llama_sampler_accept(self.ptr, tok)
        return tok

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None
        if self.grammar is not None:
            lc.llama_sampler_free(self.grammar)
            self.grammar = None
