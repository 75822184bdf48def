"""Admission: a waiting request into a free slot of the engine, with what it starts from.

Each step, :meth:`Admission._admit` takes waiting requests in the scheduler's order (:class:`~llamafleet.engine.
scheduler.Waiting`) while slots are free and the step's KV copies leave time: it builds the request's sampler chain
(penalties, grammar, bias; a greedy request without them samples without one) and thinking budget, places its prompt
(:meth:`~llamafleet.engine.prefix.SlotIndex.place`: a slot and the longest prefix already computed) and gives the
new sequence that KV (:meth:`Admission._start`): restored from a KV tier (:mod:`llamafleet.engine.kv_tiers`), kept in
place, copied from another slot, or waited for while another sequence prefills the shared prefix
(:meth:`Admission._end_waits`). Only the rest of the prompt is prefilled. The engine
(:class:`~llamafleet.engine.engine.Engine`) takes these methods from :class:`Admission`.
"""

from __future__ import annotations

import random

from llamafleet.engine.budget import ThinkBudget
from llamafleet.engine.held_keys import HeldKeys
from llamafleet.engine.kv_tiers import KvTiers
from llamafleet.engine.llama import Context, Model
from llamafleet.engine.llama_sampler import SamplerChain
from llamafleet.engine.lora import Adapters
from llamafleet.engine.prefix import Placement, SlotIndex
from llamafleet.engine.scheduler import Waiting
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.speculative.speculator import Speculator
from llamafleet.engine.textside import TextSide


class Admission(TextSide[Model]):
    """Free slots filled from the waiting requests (the engine's queues, context and tiers: set by the engine; the
    model's family and tokenizer: its text side)."""

    model: Model
    ctx: Context
    tiers: KvTiers
    held: HeldKeys
    spec: Speculator | None
    lora: Adapters
    _waiting: Waiting
    _running: list[Sequence]
    _slots: SlotIndex[Sequence]
    _prompt_cached: int

    def _admit(self) -> None:
        self._end_waits()
        self.tiers.budget.new_step()
        while self._waiting and self._slots.n_free:
            if self.tiers.budget.spent_out():  # this step's KV copies took a pass's time: the rest wait a step
                break
            req = self._waiting.pop(self._running, self._slots.n_free)
            if req is None:
                break  # the last slot is kept for better work (engine/scheduler.py)
            p = req.params
            chain = None
            penalties = p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
            if not p.greedy or penalties or p.grammar is not None or p.logit_bias:  # these need a chain, greedy too
                seed = p.seed if p.seed is not None else random.getrandbits(32)
                chain = SamplerChain(p, self.model, seed)
                if p.penalty_last_n:
                    chain.accept(req.prompt_tokens[-p.penalty_last_n:] if p.penalty_last_n > 0 else req.prompt_tokens)
            lora = self.lora.resolve(p.lora)  # adapters' KV is neither reused nor shared (engine/lora.py)
            place = self._slots.place(req.prompt_tokens, reuse=not p.prompt_logprobs and not lora)  # scoring: all
            in_graph = (self.ctx.backend_sampling and chain is None and not p.logprobs and not p.prompt_logprobs
                        and p.think_budget is None)
            if self.ctx.backend_sampling and not in_graph:
                self.ctx.use_backend_greedy(place.slot, False)
            s = Sequence(req, place.slot, chain, in_graph, lora=lora)
            s.budget = ThinkBudget.of(p.think_budget, self.family, lambda t: self.tokenize(t, False, True),
                                      bool(self.opened_think(req.prompt_tokens)))
            self._slots.take(s, shared=not lora)
            self._running.append(s)
            self._start(s, place)
            if self.spec is not None:
                self.spec.admit(s)

    # -- prefix reuse (the choices are engine/prefix.py's and engine/kv_tiers.py's; here they are applied) -------
    def _start(self, s: Sequence, place: Placement[Sequence]) -> None:
        """Give the new sequence ``s`` the KV that ``place`` (or a KV tier) found for its prompt; only the rest is
        prefilled."""
        if place.lost is not None and self.tiers.enabled:  # the router's keys follow the state into a tier
            self.held.tag(place.lost)
        restored = self.tiers.admit(self.ctx, s, place)
        if restored:
            self._reuse(s, restored)
            return
        if place.wait and place.source is not None:
            self._reuse(s, 0)
            s.wait_for = (place.source, place.reuse)
            return
        if place.source is not None:
            self.ctx.copy_sequence(place.source.slot, s.slot)
        self._reuse(s, place.reuse)

    def _end_waits(self) -> None:
        """A sequence waiting for another's prefill copies that KV once it covers the shared prefix (or that
        sequence has stopped: then what it computed, if it is still there and worth a copy)."""
        for s in self._running:  # admission order: one that waits for a waiting sequence comes after it
            if s.wait_for is None:
                continue
            lead, n = s.wait_for
            if lead.n_cached < n and not lead.done:
                continue
            s.wait_for = None
            n = min(n, lead.n_cached) if self._slots.holds(lead) else 0
            if n >= self._slots.min_reuse:
                self.ctx.copy_sequence(lead.slot, s.slot)
                self._reuse(s, n)

    def _reuse(self, s: Sequence, n: int) -> None:
        """Keep the first ``n`` tokens of ``s``'s KV (they match its prompt) and drop the rest."""
        if not self.ctx.keep_prefix(s.slot, n):  # a memory that cannot be cut part-way: start empty
            self.ctx.keep_prefix(s.slot, 0)
            n = 0
        s.n_cached = s.n_reused = n
        self._prompt_cached += n
