"""A draft model: a smaller GGUF with the target's vocabulary, loaded beside it in the same process, drafting greedily.

It has its own context with as many slots as the target's, each mirroring the target slot of the same number. A
slot's KV holds what :attr:`DraftModel.held` lists: a prefix of the sequence's tokens, then the drafts fed after
them. Each ask carries the sequence's tokens as they now are; the KV is cut back to the longest prefix they share
with what it holds (``llama_memory_seq_rm``), which gives back a rejected draft's positions without a separate
call, then the missing tokens are fed (the whole prompt the first time, the target's own token after a rejection)
and the drafts follow one pass at a time, every asking sequence in the same pass. The last draft is never fed: the
next ask finds out whether it was kept.

A model whose vocabulary is not the target's is refused at load (:func:`check_vocab`): its token ids would mean
other text, so its drafts would be rejected, or worse, accepted with another meaning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from llamafleet.engine.llama import Batch, Context, Model
from llamafleet.engine.speculative.policy import PassCost
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.speculative.source import Ask
from llamafleet.engine.types import EngineConfig

log = logging.getLogger(__name__)
LAG = 64  # tokens a slot may be behind its sequence and still catch up and draft in one step


def check_vocab(target: Model, draft: Model, path: str) -> None:
    """``ValueError`` unless ``draft`` has ``target``'s vocabulary: its size, every token's text, the end-of-
    generation tokens and BOS."""
    why = None
    if draft.n_vocab != target.n_vocab:
        why = f"it has {draft.n_vocab} tokens, the model {target.n_vocab}"
    elif (t := next((i for i, (a, b) in enumerate(zip(draft.pieces, target.pieces, strict=True)) if a != b),
                    None)) is not None:
        why = f"token {t} is {draft.pieces[t]!r} in it, {target.pieces[t]!r} in the model"
    elif not np.array_equal(draft.eog, target.eog):
        why = "its end-of-generation tokens differ"
    elif draft.bos != target.bos or draft.add_bos != target.add_bos:
        why = "its BOS token differs"
    if why:
        raise ValueError(f"speculative.draft_model {path}: its vocabulary is not the served model's ({why}); a draft "
                         "model must share the model's tokenizer (a smaller model of the same family), or use "
                         "speculative mode ngram")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


class DraftModel:
    """The draft source of ``speculative.mode: draft``: the model at ``cfg.speculative.draft_model``, its context
    shaped like the target's (``cfg``), its vocabulary checked against ``target``'s."""

    def __init__(self, target: Model, cfg: EngineConfig) -> None:
        path = cfg.speculative.draft_model
        assert path is not None
        # on this host's devices only: a pass per drafted token over the network to RPC servers would cost more
        # than it saves (and a tensor_split naming their devices does not apply without them)
        dcfg = replace(cfg, model_path=path, backend_sampling=False, speculative=SpeculativeConfig(), rpc_servers=(),
                       tensor_split=() if cfg.rpc_servers else cfg.tensor_split)
        self.model = Model(dcfg)
        try:
            check_vocab(target, self.model, path)
            if self.model.recurrent:  # its state could not be cut back to the tokens the target kept
                raise ValueError(f"speculative.draft_model {path}: a recurrent or hybrid model cannot draft (its "
                                 "state cannot be rolled back past rejected drafts); use a transformer draft")
            self.ctx = Context(self.model, dcfg)
        except BaseException:
            self.model.close()
            raise
        self.batch = Batch(cfg.n_batch)
        self.held: list[list[int]] = [[] for _ in range(cfg.n_seq)]  # per slot: the tokens its KV holds
        self._sure = [0] * cfg.n_seq  # per slot: how many of them are the sequence's own (it only grows)
        self.cost = PassCost()  # what a drafting pass costs, by its number of tokens
        self.catch_up = max(1, cfg.prefill_tokens or cfg.n_batch)  # most tokens fed a step to catch up on prompts
        self._time_passes()

    def _time_passes(self) -> None:
        """Seed :attr:`cost` with drafting passes of 1 and (up to) 4 sequences, then empty their slots: the policy
        knows what drafting costs, and what one more token costs on this hardware, before it first drafts."""
        n = min(4, len(self.held))
        for k in (1, n, 1, n):
            if self._pass([Ask(i, [], 1) for i in range(k)], [[0] for _ in range(k)]) is None:
                break
        for i in range(n):
            self._cut(i, 0)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def start(self, slot: int, tokens: Sequence[int]) -> None:
        self._sure[slot] = self._cut(slot, _common(self.held[slot], tokens))  # the slot's prefix may serve again

    def stop(self, slot: int) -> None:
        pass  # its KV stays, for a later sequence in the slot that shares a prefix

    def _cut(self, slot: int, n: int) -> int:
        if n < len(self.held[slot]):
            self.ctx.keep_prefix(slot, n)
            del self.held[slot][n:]
        return n

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        """Drafts for ``asks``. Sequences more than :data:`LAG` tokens behind (a new prompt) catch up at most
        :attr:`catch_up` tokens a step, all of them together, as the model's own prefill does, and draft once they
        have caught up: one long prompt never holds up the step of every other sequence."""
        drafts: list[list[int]] = [[] for _ in asks]
        pending: list[list[int]] = []  # per ask: tokens still to feed (the ones it lacks, or its latest draft)
        behind: set[int] = set()  # asks that only catch up this step
        room = self.catch_up
        for i, a in enumerate(asks):  # cut each slot back to what it shares with the sequence (the last token is
            sure = self._sure[a.slot]  # fed again, for its logits)
            n = sure + _common(self.held[a.slot][sure:], a.tokens[sure:])
            self._sure[a.slot] = self._cut(a.slot, min(n, len(a.tokens) - 1))
            feed = list(a.tokens[self._sure[a.slot]:])
            if len(feed) > LAG:  # a prompt, not the few tokens since its last draft
                if len(feed) > room:
                    behind.add(i)
                feed = feed[:room]
                room -= len(feed)
            pending.append(feed)
        while any(pending):
            rows = self._pass(asks, pending)
            if rows is None:  # the draft model failed: no drafts this step, and its slots start over
                for a in asks:
                    self._sure[a.slot] = self._cut(a.slot, 0)
                return [[] for _ in asks]
            for i, tok in rows.items():
                if i in behind:
                    continue
                drafts[i].append(tok)
                if len(drafts[i]) < asks[i].n and not self.model.eog[tok]:
                    pending[i] = [tok]
        return drafts

    def _pass(self, asks: list[Ask], pending: list[list[int]]) -> dict[int, int] | None:
        """One pass over as much of ``pending`` as the batch takes (fed tokens leave it); the greedy token after each
        ask whose feed it finished, by the ask's index; None if llama.cpp refused the pass."""
        b, n, outs = self.batch, 0, []
        for i, (a, feed) in enumerate(zip(asks, pending, strict=True)):
            k = min(len(feed), b.capacity - n)
            if k == 0:
                continue
            held = self.held[a.slot]
            b.token[n:n + k] = feed[:k]
            b.pos[n:n + k] = np.arange(len(held), len(held) + k)
            b.seq[n:n + k] = a.slot
            b.logits[n:n + k] = 0
            held += feed[:k]
            del feed[:k]
            n += k
            if not feed:
                b.logits[n - 1] = 1
                outs.append(i)
        b.n_tokens = n
        t0 = time.perf_counter()
        rc = self.ctx.launch(b)
        self.ctx.wait()
        if rc != 0:
            log.warning("the draft model's llama_decode failed with status %d on %d tokens: no drafts this step", rc, n)
            return None
        if n == len(outs):  # a drafting pass, one token per sequence: a sample of what drafting costs
            self.cost.observe(n, time.perf_counter() - t0)
        best = np.argmax(self.ctx.logits(len(outs)), axis=1)
        return {i: int(t) for i, t in zip(outs, best, strict=True)}
