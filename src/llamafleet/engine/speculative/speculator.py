"""What the engine asks of speculation each step: who drafts and how much, where their logits rows are, what the
target kept, and the KV of the rejected drafts given back.

A decoding sequence that speculates feeds its last token and its drafts to the same ``llama_decode`` as every
other sequence, with logits at each of those positions; the pass is collected and verified
(:mod:`llamafleet.engine.speculative.verify`) like any other, and the positions of rejected drafts are removed from
its KV (``llama_memory_seq_rm``) before it decodes again. A sequence speculates unless its request opted out or
needs something speculation does not serve (prompt scores, in-graph sampling).
"""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt

from llamafleet.engine.llama import Context, Model
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.speculative.draft_model import DraftModel
from llamafleet.engine.speculative.policy import PassCost, Track
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.speculative.source import Ask, DraftSource, NgramSource
from llamafleet.engine.speculative.verify import Kept, verify
from llamafleet.engine.types import EngineConfig

log = logging.getLogger(__name__)
Entry = tuple[Sequence, int]  # (sequence, batch index or logits row)


class Speculator:
    """Speculative decoding for one engine, with the draft source ``cfg.mode`` names."""

    def __init__(self, cfg: SpeculativeConfig, n_ctx_per_seq: int, source: DraftSource | None = None) -> None:
        self.cfg = cfg
        self.n_ctx_per_seq = n_ctx_per_seq
        self.source = source or NgramSource(cfg.ngram_min, cfg.ngram_max)
        self.draft_model = source if isinstance(source, DraftModel) else None
        self.cost = PassCost()  # what decode passes cost, by their number of tokens
        self.drafted_total = 0
        self.accepted_total = 0

    @classmethod
    def create(cls, cfg: EngineConfig, model: Model) -> Speculator | None:
        """The engine's speculator for ``model``, or None: speculation off, or a model whose state cannot be cut
        back (recurrent or hybrid: the KV of rejected drafts could not be given back). With a draft model, that
        model is loaded (``ValueError`` if its vocabulary is not ``model``'s)."""
        if not cfg.speculative.on:
            return None
        if model.recurrent:
            log.warning("speculative decoding is off for %s: a recurrent model's state cannot be rolled back past "
                        "rejected drafts", cfg.model_path)
            return None
        source = DraftModel(model, cfg) if cfg.speculative.mode == "draft" else None
        return cls(cfg.speculative, cfg.n_ctx_per_seq, source)

    def close(self) -> None:
        """Free the draft model, if there is one."""
        if self.draft_model is not None:
            self.draft_model.close()

    def admit(self, s: Sequence) -> None:
        """``s`` has just taken its slot: it speculates from now on if its request allows it."""
        p = s.req.params
        # a reasoning budget forces its close marker through one row's logits at a time (engine/budget.py), which
        # verified drafts would skip: a budgeted answer does not speculate
        if p.speculative and not s.in_graph and not p.prompt_logprobs and p.max_tokens != 0 and s.budget is None:
            s.spec = Track(self.cfg.max_draft)
            self.source.start(s.slot, s.tokens)

    def release(self, s: Sequence) -> None:
        if s.spec is not None:
            self.source.stop(s.slot)

    def draft(self, ready: list[Sequence], budget: int) -> None:
        """Give each decoding sequence of ``ready`` that speculates its drafts for this step, within ``budget``
        tokens (the step's, the decoding sequences' own tokens included); none when more than ``max_batch`` decode."""
        decoding: list[Sequence] = []
        for s in ready:
            if s.pending == 1:
                decoding.append(s)
                if len(decoding) > self.cfg.max_batch:  # (many streams: known without looking at them all)
                    return
        budget -= len(decoding)
        if budget <= 0:
            return
        c, n, dm = self.cfg.draft_cost, len(decoding), self.draft_model
        r = self.cost.share(n) if c is None else c / (1.0 + c * n)  # one more token's share of this step
        if c is None and dm is not None:  # each drafted token costs a pass of the draft model too; until the
            # target's passes of several sizes were timed, its share of a token is taken to be the draft's
            r = r or dm.cost.share(n)
            step = self.cost.seconds(n)
            r += dm.cost.seconds(n) / step if step > 0 else 1.0  # (no draft before a step of the target was timed)
        asks: list[tuple[Sequence, Track, Ask]] = []
        for s in decoding:
            t = s.spec
            if t is None:
                continue
            p = s.req.params
            room = self.n_ctx_per_seq - len(s.tokens) - 1  # the last draft's position stays inside the context
            if p.max_tokens is not None:
                room = min(room, p.max_tokens - s.n_generated - 1)  # the token after the drafts would be the last
            n = t.worth(min(t.max_draft, room, budget), r, len(decoding))
            if n > 0:
                asks.append((s, t, Ask(s.slot, s.tokens, n)))
                budget -= n
        for (_, t, _), d in zip(asks, self.source.propose([a for _, _, a in asks]), strict=True):
            t.draft = d

    def observe(self, plan: list[Entry], seconds: float) -> None:
        """A pass of ``plan`` took ``seconds``: a sample of the cost of decoding passes. Only passes of the steps where
        drafts are decided count: one with prompt chunks in it says little about a few more tokens, and one of more
        than ``max_batch`` answers lies where a GPU's cost per token is no longer that of a few (a line fitted
        through both would overstate what a draft costs one stream)."""
        if len(plan) <= self.cfg.max_batch and all(s.pending == 1 and k == 1 + s.n_draft for s, k in plan):
            self.cost.observe(sum(k for _, k in plan), seconds)

    @staticmethod
    def flag(sampled: list[Entry], flags: npt.NDArray[np.int8]) -> None:
        """Ask for logits at every drafted position too (``sampled``: each sequence's last verified token)."""
        for s, bi in sampled:
            if s.n_draft:
                flags[bi + 1:bi + 1 + s.n_draft] = 1

    @staticmethod
    def split(sampled: list[Entry], rows: npt.NDArray[np.int64] | None
              ) -> tuple[list[Entry], npt.NDArray[np.int64] | None, list[Entry]]:
        """``sampled`` (with their logits ``rows``: None when row i is entry i's) into the entries sampled as usual,
        their rows, and the drafting ones with their first row."""
        if rows is None:
            return sampled, None, []
        drafting = [bool(s.n_draft) for s, _ in sampled]
        if not any(drafting):
            return sampled, rows, []
        plain = [i for i, d in enumerate(drafting) if not d]
        return ([sampled[i] for i in plain], rows[plain],
                [(s, int(r)) for (s, _), r, d in zip(sampled, rows, drafting, strict=True) if d])

    @staticmethod
    def verify(ctx: Context, s: Sequence, logits: npt.NDArray[np.float32], row: int) -> list[Kept] | None:
        """The tokens ``s`` keeps from its rows of ``logits`` starting at ``row`` (None if it has ended)."""
        assert s.spec is not None
        if s.done:
            return None
        return verify(ctx, s, s.spec.draft, logits[row:row + 1 + len(s.spec.draft)])

    def settle(self, ctx: Context, s: Sequence, kept: int | None) -> None:
        """After ``s`` kept ``kept`` tokens of a pass with drafts (None: none verified, it ended while the pass ran):
        count, adapt, and cut the rejected drafts' KV.

        ``s.n_cached`` counted every position the pass decoded; only the last verified token and the accepted
        drafts are ``s``'s (the last kept token is not decoded yet), and never more than the tokens it has."""
        assert s.spec is not None
        d = len(s.spec.draft)
        accepted = max(0, (kept or 0) - 1)
        n = min(s.n_cached - d + accepted, len(s.tokens))
        if n < s.n_cached:
            ctx.keep_prefix(s.slot, n)
            s.n_cached = n
        if kept is None:
            s.spec.draft = []
            return
        s.spec.settle(accepted)
        self.drafted_total += d
        self.accepted_total += accepted
